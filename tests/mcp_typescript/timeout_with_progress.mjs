// A 2 s test.sleep call reporting progress every 100 ms, under a 500 ms timeout:
// `node timeout_with_progress.mjs reset` lets progress reset the timeout, without
// `reset` the timeout stands.

import { connect, rejection, reportThenEnd, run } from "./session.mjs";

run(async () => {
  const resetTimeoutOnProgress = process.argv[2] === "reset";
  const session = await connect();
  const progress = [];
  const started = Date.now();
  let outcome;
  try {
    const result = await session.client.callTool(
      { name: "test.sleep", arguments: { mode: "checkpoint", steps: 20, stepMs: 100 } },
      undefined,
      { timeout: 500, resetTimeoutOnProgress, onprogress: (update) => progress.push(update) },
    );
    outcome = { resolved: result };
  } catch (error) {
    outcome = { rejected: rejection(error) };
  }
  await reportThenEnd(session, { ...outcome, progress, elapsedMs: Date.now() - started });
});
