// tools/list, then one convert.markdownToHtml call: what an MCP client sees first.

import { connect, reportThenEnd, run } from "./session.mjs";

run(async () => {
  const session = await connect();
  const { tools } = await session.client.listTools();
  const result = await session.client.callTool({
    name: "convert.markdownToHtml",
    arguments: { markdown: "# Hello\n\nFrom *TypeScript*." },
  });
  await reportThenEnd(session, {
    protocolVersion: session.transport.protocolVersion,
    tools: tools.map((tool) => ({
      name: tool.name,
      hasInputSchema: tool.inputSchema?.type === "object",
      available: tool._meta?.["abp/available"],
    })),
    result: { isError: result.isError ?? false, structuredContent: result.structuredContent },
  });
});
