// Two short test.sleep calls that finish: one without a progressToken, then one with
// a progressToken and a callId of its own.

import { connect, rejection, reportThenEnd, run } from "./session.mjs";

run(async () => {
  const progress = [];
  const session = await connect({ onProgress: (params) => progress.push(params) });
  const call = async (params) => {
    try {
      return { resolved: await session.connection.agent.request("_abp/call", params) };
    } catch (error) {
      return { rejected: rejection(error) };
    }
  };
  const plain = await call({
    capability: "test.sleep",
    params: { steps: 2, stepMs: 10, echo: "hi" },
  });
  const withProgress = await call({
    capability: "test.sleep",
    params: { steps: 3, stepMs: 10, echo: { nested: [1, "two"] } },
    callId: "acp-with-progress",
    _meta: { progressToken: "p3" },
  });
  await reportThenEnd(session, { plain, withProgress, progress });
});
