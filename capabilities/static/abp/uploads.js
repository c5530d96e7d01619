// @ts-check
/**
 * Uploads, our extension to ABP (docs/uploads.md): a large binary input is sent once
 * as raw bytes to `POST /abp/uploads`, and the call names it by the reference the
 * route answers (`{uploadId, size, mimeType, expiresAt}`) instead of carrying it as
 * base64 in the frame.
 *
 * client.js (over a WebSocket) and the embed bridge use it for every binary input of
 * UPLOAD_MIN_BYTES or more: an ArrayBuffer, a view, a Blob, or base64 text. An upload
 * that fails (an older server, an expired page token, a network error) leaves the
 * input as it was: it then goes inline, as before, and the server judges it there.
 * @module abp/uploads
 */

import { base64ToBytes, isRecord } from "./wire.js";

/** Where uploads go, on the app's own origin. */
export const UPLOAD_PATH = "/abp/uploads";
/** Binary inputs at least this large are uploaded; smaller ones stay inline. */
export const UPLOAD_MIN_BYTES = 64 * 1024;

/**
 * The upload route of the app a WebSocket URL (ws: or wss:) points at.
 * @param {string} socketUrl
 */
export function uploadUrl(socketUrl) {
  const url = new URL(UPLOAD_PATH, socketUrl);
  url.protocol = url.protocol === "wss:" ? "https:" : "http:";
  return url.href;
}

/**
 * @typedef {object} UploadTarget
 * @property {string} url The upload route (uploadUrl()).
 * @property {string | undefined} token The connection's credential: an agent key or a page token.
 * @property {string | null | undefined} sessionId The session the uploads are for.
 */

/**
 * A copy of a call's params in which each large binary input (a top-level parameter
 * `{content, mimeType}`) is the reference of its upload.
 * @param {unknown} params
 * @param {UploadTarget} target
 * @returns {Promise<unknown>}
 */
export async function uploadBinaryInputs(params, target) {
  if (!isRecord(params) || !target.sessionId) return params;
  /** @type {Record<string, unknown>} */
  const out = { ...params };
  for (const [key, value] of Object.entries(params)) {
    if (!isRecord(value) || value.uploadId !== undefined) continue;
    const body = bodyOf(value.content, value.encoding);
    if (body === null || body.size < UPLOAD_MIN_BYTES) continue;
    const mimeType = typeof value.mimeType === "string" ? value.mimeType : body.type || "application/octet-stream";
    const reference = await upload(body, mimeType, target);
    if (reference !== null) out[key] = reference;
  }
  return out;
}

/**
 * The bytes of a binary input as a Blob (fetch sends its Content-Length), or null.
 * @param {unknown} content
 * @param {unknown} encoding
 * @returns {Blob | null}
 */
function bodyOf(content, encoding) {
  if (content instanceof Blob) return content;
  if (content instanceof ArrayBuffer || ArrayBuffer.isView(content)) return new Blob([content]);
  // base64 text: decoded only when large enough to be worth an upload.
  if (typeof content === "string" && (encoding === undefined || encoding === "base64")) {
    if ((content.length * 3) / 4 < UPLOAD_MIN_BYTES) return null;
    try {
      return new Blob([/** @type {Uint8Array<ArrayBuffer>} */ (base64ToBytes(content))]);
    } catch {
      return null; // not base64: the server says so
    }
  }
  return null;
}

/**
 * POST the bytes; the route's answer, or null when the upload did not happen.
 * @param {Blob} body
 * @param {string} mimeType
 * @param {UploadTarget} target
 * @returns {Promise<Record<string, unknown> | null>}
 */
async function upload(body, mimeType, target) {
  /** @type {Record<string, string>} */
  const headers = { "Content-Type": mimeType, "ABP-Session": String(target.sessionId) };
  if (target.token) headers.Authorization = `Bearer ${target.token}`;
  try {
    const response = await fetch(target.url, { method: "POST", body, headers, credentials: "omit" });
    if (!response.ok) return null;
    const reference = await response.json();
    return isRecord(reference) && typeof reference.uploadId === "string" ? reference : null;
  } catch {
    return null;
  }
}
