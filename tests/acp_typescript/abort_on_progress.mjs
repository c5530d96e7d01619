// A long test.sleep call whose cancellationSignal is aborted at its first progress.
// `node abort_on_progress.mjs stop-waiting` also sets stopWaitingOnCancel: the SDK
// rejects at once and drops the server's own -32800, which the report still shows.

import { connect, rejection, reportThenEnd, requestIdOf, responseTo, run } from "./session.mjs";

run(async () => {
  const stopWaitingOnCancel = process.argv[2] === "stop-waiting";
  const controller = new AbortController();
  const progress = [];
  const session = await connect({
    onProgress: (params) => {
      progress.push(params);
      controller.abort("the user pressed stop");
    },
  });
  const started = Date.now();
  let outcome;
  try {
    const result = await session.connection.agent.request(
      "_abp/call",
      {
        capability: "test.sleep",
        params: { mode: "checkpoint", steps: 500, stepMs: 20 },
        _meta: { progressToken: "p1" },
      },
      { cancellationSignal: controller.signal, stopWaitingOnCancel },
    );
    outcome = { resolved: result };
  } catch (error) {
    outcome = { rejected: rejection(error) };
  }
  const elapsedMs = Date.now() - started;
  // The server answers the call once all the same; with stopWaitingOnCancel the SDK
  // drops that answer, so it is read from the frames.
  const requestId = requestIdOf(session.frames, "_abp/call");
  const serverResponse = await responseTo(session.frames, requestId, 5000);
  await reportThenEnd(session, { ...outcome, progress, elapsedMs, requestId, serverResponse });
});
