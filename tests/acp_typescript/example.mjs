// docs/jsonrpc.md: a long export.pdf, cancelled with the ACP SDK at its first progress.
import { client } from "@agentclientprotocol/sdk";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import WebSocket from "ws";

const stop = new AbortController();
const headers = process.env.ABP_KEY ? { Authorization: `Bearer ${process.env.ABP_KEY}` } : {};
const url = process.env.ABP_RPC_URL ?? "ws://127.0.0.1:8000/abp/rpc";
const connection = client()
  .onNotification("_abp/progress", (params) => params, () => stop.abort())
  .connect(createWebSocketStream(url, { WebSocket, headers }));
await connection.agent.request("initialize", { protocolVersion: 1 });
const html = "<h1 style='page-break-after: always'>Page</h1>".repeat(300);
const call = { capability: "export.pdf", params: { html }, _meta: { progressToken: "p1" } };
await connection.agent // aborting the signal sends $/cancel_request; the job stops
  .request("_abp/call", call, { cancellationSignal: stop.signal })
  .catch((error) => console.log(error.code, error.data.code, error.data.callId)); // -32800 CANCELLED
connection.close();
