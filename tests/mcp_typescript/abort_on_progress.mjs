// A long test.sleep call, aborted with an AbortController at its first progress.

import { connect, rejection, reportThenEnd, run } from "./session.mjs";

run(async () => {
  const session = await connect();
  const controller = new AbortController();
  const progress = [];
  const started = Date.now();
  let outcome;
  try {
    const result = await session.client.callTool(
      { name: "test.sleep", arguments: { mode: "checkpoint", steps: 500, stepMs: 20 } },
      undefined,
      {
        signal: controller.signal,
        onprogress: (update) => {
          progress.push(update);
          controller.abort("the user pressed stop");
        },
      },
    );
    outcome = { resolved: result };
  } catch (error) {
    outcome = { rejected: rejection(error) };
  }
  await reportThenEnd(session, { ...outcome, progress, elapsedMs: Date.now() - started });
});
