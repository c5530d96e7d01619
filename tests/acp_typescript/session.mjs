// One JSON-RPC session on /abp/rpc, opened with the official ACP TypeScript SDK.
//
// Every script prints one JSON line (its report), then keeps the WebSocket open until
// its standard input closes: the Python test reads the database meanwhile, so the
// socket's close (a disconnect, which cancels what is still running) cannot race what
// the test looks at. Every frame sent and received is kept for the report, so a
// failing test shows the wire.

import { client, RequestError } from "@agentclientprotocol/sdk";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import WebSocket from "ws";
import { z } from "zod";

// A script that hangs exits instead, so the test reads an end of file, never waits.
const WATCHDOG_MS = 60_000;

// `_abp/progress` params (docs/jsonrpc.md); loose, so the report shows every field.
const Progress = z.looseObject({
  progressToken: z.union([z.string(), z.number()]),
  callId: z.string(),
  progress: z.number(),
});

/**
 * Connect to ABP_RPC_URL with the key in ABP_AGENT_KEY and initialize.
 *
 * `onProgress(params, agent)` gets every `_abp/progress` notification.
 */
export async function connect({ onProgress } = {}) {
  const watchdog = setTimeout(() => {
    console.error(`no end after ${WATCHDOG_MS} ms`);
    process.exit(3);
  }, WATCHDOG_MS);
  watchdog.unref();
  const frames = [];
  const stream = tap(
    createWebSocketStream(process.env.ABP_RPC_URL, {
      WebSocket,
      headers: { Authorization: `Bearer ${process.env.ABP_AGENT_KEY}` },
    }),
    frames,
  );
  const connection = client({ name: "abp-acp-typescript-tests" })
    .onNotification("_abp/progress", Progress, ({ params, agent }) => onProgress?.(params, agent))
    .connect(stream);
  const initialized = await connection.agent.request("initialize", {
    protocolVersion: 1,
    clientInfo: { name: "abp-acp-typescript-tests", version: "1.0.0" },
  });
  return { connection, initialized, frames };
}

/** Print the report, wait for standard input to close, then close the connection. */
export async function reportThenEnd({ connection, initialized, frames }, report) {
  const sessionId = initialized?._meta?.["abp/sessionId"];
  process.stdout.write(`${JSON.stringify({ sessionId, initialized, ...report, frames })}\n`);
  await stdinClosed();
  connection.close();
}

/** What a rejected request gave: the JSON-RPC error as the SDK surfaced it. */
export function rejection(error) {
  return {
    requestError: error instanceof RequestError,
    name: error?.name,
    code: error?.code,
    message: String(error?.message ?? error),
    data: error?.data,
  };
}

/** The first frame received that answers request `id`, waiting up to `ms` for it. */
export async function responseTo(frames, id, ms) {
  const deadline = Date.now() + ms;
  for (;;) {
    const found = frames.find(
      (frame) => frame.direction === "received" && frame.message.id === id && !frame.message.method,
    );
    if (found || Date.now() > deadline) {
      return found?.message;
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** The id of the first request sent with `method`. */
export function requestIdOf(frames, method) {
  return frames.find((frame) => frame.direction === "sent" && frame.message.method === method)
    ?.message.id;
}

/** Run `main`; any error it throws is printed and fails the script. */
export function run(main) {
  main().then(
    () => process.exit(0),
    (error) => {
      console.error(error?.stack ?? String(error));
      process.exit(1);
    },
  );
}

// The SDK's stream with every message in and out recorded, with milliseconds since
// the connection opened.
function tap(stream, frames) {
  const opened = Date.now();
  const record = (direction, message) => {
    frames.push({ direction, ms: Date.now() - opened, message });
  };
  const writer = stream.writable.getWriter();
  return {
    readable: stream.readable.pipeThrough(
      new TransformStream({
        transform(message, controller) {
          record("received", message);
          controller.enqueue(message);
        },
      }),
    ),
    writable: new WritableStream({
      write(message) {
        record("sent", message);
        return writer.write(message);
      },
      close: () => writer.close(),
      abort: (reason) => writer.abort(reason),
    }),
  };
}

function stdinClosed() {
  return new Promise((resolve) => {
    process.stdin.on("end", resolve);
    process.stdin.resume();
  });
}
