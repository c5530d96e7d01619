"""The MCP front door: the same jobs as MCP tools at /mcp (Streamable HTTP)."""
