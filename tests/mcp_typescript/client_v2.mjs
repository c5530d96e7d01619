// The TypeScript SDK v2 client (@modelcontextprotocol/client), in either era:
// `node client_v2.mjs MODE COUNT` with MODE `auto` (2026-07-28 when the server speaks
// it) or `legacy` (the 2025 initialize handshake). It makes COUNT concurrent
// Markdown calls, then one long call aborted with an AbortController at its first
// progress, and reports what came back. The session (legacy) is held until standard
// input closes, then left without a DELETE, as `client.close()` leaves it.

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const WATCHDOG_MS = 60_000;

async function main() {
  const [mode, countText] = process.argv.slice(2);
  const watchdog = setTimeout(() => {
    console.error(`no end after ${WATCHDOG_MS} ms`);
    process.exit(3);
  }, WATCHDOG_MS);
  watchdog.unref();
  const transport = new StreamableHTTPClientTransport(new URL(process.env.ABP_MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.ABP_AGENT_KEY}` } },
  });
  const client = new Client(
    { name: "abp-mcp-client-v2-tests", version: "1.0.0" },
    { versionNegotiation: { mode } },
  );
  await client.connect(transport);

  const calls = Array.from({ length: Number(countText) }, (_, n) =>
    client.callTool({ name: "convert.markdownToHtml", arguments: { markdown: `# Call ${n}` } }),
  );
  const settled = await Promise.allSettled(calls);
  const results = settled.map((outcome) =>
    outcome.status === "fulfilled"
      ? {
          isError: outcome.value.isError ?? false,
          code: outcome.value.structuredContent?.error?.code ?? null,
          html: outcome.value.structuredContent?.html ?? null,
        }
      : { rejected: String(outcome.reason?.message ?? outcome.reason) },
  );

  const controller = new AbortController();
  let progressed = false;
  let aborted = null;
  try {
    await client.callTool(
      { name: "test.sleep", arguments: { mode: "checkpoint", steps: 3000, stepMs: 20 } },
      {
        signal: controller.signal,
        onprogress: () => {
          progressed = true;
          controller.abort("enough");
        },
      },
    );
  } catch (error) {
    aborted = { name: error?.name, message: String(error?.message ?? error) };
  }

  process.stdout.write(
    `${JSON.stringify({
      protocolVersion: client.getNegotiatedProtocolVersion(),
      sessionId: transport.sessionId ?? null,
      results,
      progressed,
      aborted,
    })}\n`,
  );
  await new Promise((resolve) => {
    process.stdin.on("end", resolve);
    process.stdin.resume();
  });
  await client.close();
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(error?.stack ?? String(error));
    process.exit(1);
  },
);
