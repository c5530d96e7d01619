// A long test.sleep run as a task with the experimental tasks client, then cancelled
// with tasks/cancel as soon as the task exists.

import { connect, rejection, reportThenEnd, run } from "./session.mjs";

run(async () => {
  const session = await connect();
  const tasks = session.client.experimental.tasks;
  const messages = [];
  let taskId;
  let cancelled;
  let afterCancel;
  const stream = tasks.callToolStream(
    { name: "test.sleep", arguments: { mode: "checkpoint", steps: 3000, stepMs: 20 } },
    undefined,
    { task: { ttl: 60_000 } },
  );
  try {
    for await (const message of stream) {
      messages.push({ type: message.type, status: message.task?.status });
      if (message.type === "taskCreated" && taskId === undefined) {
        taskId = message.task.taskId;
        cancelled = await tasks.cancelTask(taskId);
        afterCancel = await tasks.getTask(taskId);
      }
      if (message.type === "result" || message.type === "error") {
        break;
      }
    }
  } catch (error) {
    messages.push({ type: "thrown", error: rejection(error) });
  }
  let secondCancel;
  try {
    secondCancel = { resolved: await tasks.cancelTask(taskId) };
  } catch (error) {
    secondCancel = { rejected: rejection(error) };
  }
  await reportThenEnd(session, { taskId, cancelled, afterCancel, secondCancel, messages });
});
