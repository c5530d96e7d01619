// One MCP session on the server under test, opened with the official TypeScript SDK.
//
// Every script prints one JSON line (its report), then keeps the session open until
// its standard input closes: the Python test reads the database meanwhile, so the
// session's end (DELETE /mcp) cannot race what the test looks at.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

// A script that hangs exits instead, so the test reads an end of file, never waits.
const WATCHDOG_MS = 60_000;

/** Connect to ABP_MCP_URL with the key in ABP_AGENT_KEY; the client and its transport. */
export async function connect() {
  const watchdog = setTimeout(() => {
    console.error(`no end after ${WATCHDOG_MS} ms`);
    process.exit(3);
  }, WATCHDOG_MS);
  watchdog.unref();
  const requests = new Set();
  const transport = new StreamableHTTPClientTransport(new URL(process.env.ABP_MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.ABP_AGENT_KEY}` } },
    // POSTs are remembered so `sent` can wait for them: a `notifications/cancelled`
    // goes out in a POST of its own that the SDK does not let its caller await. Not
    // the GET stream: Daphne sends its headers only with its first event or ping.
    fetch: (url, init) => {
      const request = fetch(url, init);
      if (init?.method !== "POST") {
        return request;
      }
      requests.add(request);
      request.then(
        () => requests.delete(request),
        () => requests.delete(request),
      );
      return request;
    },
  });
  const client = new Client({ name: "abp-mcp-typescript-tests", version: "1.0.0" });
  await client.connect(transport);
  const sent = async () => {
    await Promise.allSettled([...requests]);
  };
  return { client, transport, sent };
}

/** Print the report, wait for standard input to close, then end the session. */
export async function reportThenEnd({ client, transport, sent }, report) {
  await sent();
  process.stdout.write(`${JSON.stringify({ sessionId: transport.sessionId, ...report })}\n`);
  await stdinClosed();
  await transport.terminateSession();
  await client.close();
}

/** What a rejected request gave: enough to tell a timeout from an abort. */
export function rejection(error) {
  return { name: error?.name, code: error?.code, message: String(error?.message ?? error) };
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

function stdinClosed() {
  return new Promise((resolve) => {
    process.stdin.on("end", resolve);
    process.stdin.resume();
  });
}
