// @ts-check
/**
 * ABP wire types and pure helpers shared by the browser modules (client.js, bridge.js,
 * page_token.js, and runtime.js through client.js): the envelope, error codes,
 * responses built locally, and binary conversion. No I/O here.
 *
 * The contract is ABP 0.1 as PROTOCOL.md writes it.
 * @module abp/wire
 */

export const PROTOCOL_VERSION = "0.1";

/** ABP message types. */
export const MessageType = Object.freeze({
  INITIALIZE: "initialize",
  INITIALIZE_RESULT: "initialize-result",
  CALL: "capabilities/call",
  CALL_RESULT: "capabilities/call-result",
  CANCEL: "capabilities/cancel",
  CANCEL_RESULT: "capabilities/cancel-result",
  SHUTDOWN: "shutdown",
  NOTIFICATION: "notification",
  PROGRESS: "progress",
  ELICITATION_REQUEST: "elicitation/request",
  ELICITATION_RESPONSE: "elicitation/response",
});

/** The reply type of each request type that has one. @type {Readonly<Record<string, string>>} */
export const REPLY_TYPES = Object.freeze({
  [MessageType.INITIALIZE]: MessageType.INITIALIZE_RESULT,
  [MessageType.CALL]: MessageType.CALL_RESULT,
  [MessageType.CANCEL]: MessageType.CANCEL_RESULT,
});

/**
 * Messages between a parent page and the /abp/embed/ bridge that are not ABP. They
 * never reach the server. Everything else a parent posts is an ABP envelope.
 */
export const BridgeMessageType = Object.freeze({
  /** parent -> bridge: are you there? Answered with READY. */
  HELLO: "abp-bridge/hello",
  /** bridge -> parent: ready to relay; payload {protocolVersion, app, maxFrameBytes}. */
  READY: "abp-bridge/ready",
  /** parent -> bridge: I am leaving; cancel my calls, end the session, close the socket. */
  DETACH: "abp-bridge/detach",
  /** bridge -> parent: the socket closed; every pending request has been answered. */
  CLOSED: "abp-bridge/closed",
});

/**
 * Error codes: the spec's, plus the server's own. The browser modules' one list; it and
 * RETRYABLE_CODES are held to the server's by tests/protocol/test_error_codes_pinned.py.
 */
export const ErrorCode = Object.freeze({
  NOT_INITIALIZED: "NOT_INITIALIZED",
  ALREADY_INITIALIZED: "ALREADY_INITIALIZED",
  SESSION_EXPIRED: "SESSION_EXPIRED",
  SESSION_INVALID: "SESSION_INVALID",
  UNKNOWN_CAPABILITY: "UNKNOWN_CAPABILITY",
  CAPABILITY_UNAVAILABLE: "CAPABILITY_UNAVAILABLE",
  INVALID_PARAMS: "INVALID_PARAMS",
  MISSING_PARAM: "MISSING_PARAM",
  INVALID_TYPE: "INVALID_TYPE",
  PERMISSION_DENIED: "PERMISSION_DENIED",
  OPERATION_FAILED: "OPERATION_FAILED",
  TIMEOUT: "TIMEOUT",
  CANCELLED: "CANCELLED",
  RATE_LIMITED: "RATE_LIMITED",
  NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
  INTERNAL_ERROR: "INTERNAL_ERROR",
  TRANSPORT_ERROR: "TRANSPORT_ERROR",
  DISCONNECTED: "DISCONNECTED",
  WORKER_LOST: "WORKER_LOST",
  PARSE_ERROR: "PARSE_ERROR",
  UNKNOWN_MESSAGE_TYPE: "UNKNOWN_MESSAGE_TYPE",
  INVALID_REQUEST: "INVALID_REQUEST",
});

/**
 * WebSocket close codes the app refuses a connection with. It accepts the upgrade,
 * says why in a `notifications/error` (PERMISSION_DENIED, `details: {reason,
 * closeCode}`; some servers, Daphne among them, send no close reason) and closes.
 */
export const CloseCode = Object.freeze({
  /** No credential, or one that is forged, expired or revoked: nothing was read. */
  UNAUTHORIZED: 4401,
  /** The connection's agent key was revoked while it was open. */
  FORBIDDEN: 4403,
});

/**
 * Close codes after which a session is resumed on a new socket (docs/protocol.md,
 * resuming): the server went away or restarts (1001, 1012), the connection dropped
 * (1006), or the server failed (1011, 1013, 1014). Any other close ends the session.
 * @type {readonly number[]}
 */
export const RESUMABLE_CLOSE_CODES = Object.freeze([1001, 1006, 1011, 1012, 1013, 1014]);

/** How long a client tries to resume a dropped session: the app's default grace period. */
export const RESUME_GRACE_MS = 60000;

/** Why a connection was refused (the close reason, or the notice's `details.reason`). */
export const Refusal = Object.freeze({
  MISSING_CREDENTIALS: "missing-credentials",
  INVALID_CREDENTIALS: "invalid-credentials",
  /** A page token past its max age: a fresh one from the token URL gets in. */
  EXPIRED_CREDENTIALS: "expired-credentials",
  KEY_REVOKED: "key-revoked",
});

/** The WebSocket subprotocol every credential-carrying connection asks for. */
export const SUBPROTOCOL = "abp";
/** A credential travels as the subprotocol `abp.bearer.<credential>`. */
export const BEARER_SUBPROTOCOL_PREFIX = "abp.bearer.";

/** Codes for which trying the same thing again later may succeed. @type {ReadonlySet<string>} */
const RETRYABLE_CODES = new Set([
  ErrorCode.RATE_LIMITED,
  ErrorCode.INTERNAL_ERROR,
  ErrorCode.TRANSPORT_ERROR,
  ErrorCode.DISCONNECTED,
  ErrorCode.WORKER_LOST,
  ErrorCode.TIMEOUT,
  ErrorCode.CAPABILITY_UNAVAILABLE,
]);

/**
 * @typedef {object} Envelope
 * @property {string} type
 * @property {string} id
 * @property {number} timestamp Unix ms.
 * @property {Record<string, any>} payload
 */

/**
 * @typedef {object} WireError The `error` object of a reply.
 * @property {string} code
 * @property {string} message
 * @property {boolean} retryable
 * @property {number} [retryAfter]
 * @property {Record<string, unknown>} [details]
 */

/**
 * @typedef {object} BinaryData Inline binary content. Over the wire `content` is
 *   base64 (`encoding: "base64"`); a call made with `binary: "arraybuffer"` gets an
 *   ArrayBuffer instead (`encoding: "arraybuffer"`).
 * @property {string | ArrayBuffer} content
 * @property {string} mimeType
 * @property {"base64" | "arraybuffer"} [encoding]
 * @property {number} [size]
 * @property {string} [filename]
 */

/**
 * @typedef {object} ABPResponse What every call settles with, exactly once.
 * @property {string} [callId]
 * @property {boolean} success
 * @property {any} [data]
 * @property {WireError} [error]
 * @property {{duration: number}} [metadata]
 * @property {boolean} [cancelled]
 */

/**
 * @typedef {object} CancelResponse
 * @property {string} callId
 * @property {boolean} cancelled
 * @property {string} [reason] Why not, when `cancelled` is false.
 * @property {WireError} [error]
 */

/**
 * @typedef {object} ProgressInfo The payload of a `progress` message.
 * @property {string | number} operationId The call's progressToken.
 * @property {number} progress
 * @property {number | null} total
 * @property {number | null} percentage
 * @property {string} stage
 * @property {string} status
 */

/**
 * @typedef {object} NotificationInfo The payload of a `notification` message.
 * @property {string} event
 * @property {any} data
 */

/**
 * @typedef {object} InitializeParams
 * @property {{name: string, version: string}} [agent]
 * @property {string} [protocolVersion]
 * @property {{notifications?: boolean, progress?: boolean, elicitation?: boolean}} [features]
 */

/**
 * @typedef {object} InitializeResult
 * @property {string} sessionId
 * @property {string} protocolVersion
 * @property {{id: string, name: string, version: string, description?: string}} app
 * @property {{name: string, available: boolean}[]} capabilities
 * @property {{notifications: boolean, progress: boolean, elicitation: boolean}} features
 */

/** An ABP error raised (not resolved): initialize and connect fail with one. */
export class ABPError extends Error {
  /** @param {WireError} error */
  constructor(error) {
    super(error.message);
    this.name = "ABPError";
    this.code = error.code;
    this.retryable = error.retryable;
    this.details = error.details;
  }
}

/**
 * The message a WebSocket text frame carries; undefined for binary frames and bad JSON.
 * @param {MessageEvent} event
 * @returns {any}
 */
export function parseTextFrame(event) {
  if (typeof event.data !== "string") return undefined;
  try {
    return JSON.parse(event.data);
  } catch {
    return undefined;
  }
}

/** @param {unknown} value @returns {value is Record<string, any>} */
export function isRecord(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A random UUID; crypto.randomUUID needs a secure context, getRandomValues does not. */
export function newId() {
  if (typeof crypto.randomUUID === "function") return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/**
 * An outgoing envelope.
 * @param {string} type
 * @param {Record<string, any>} [payload]
 * @param {string} [id]
 * @returns {Envelope}
 */
export function envelope(type, payload = {}, id = newId()) {
  return { type, id, timestamp: Date.now(), payload };
}

/**
 * An error object; `retryable` follows the code, as the server's does.
 * @param {string} code
 * @param {string} message
 * @param {Record<string, unknown>} [details]
 * @returns {WireError}
 */
export function wireError(code, message, details) {
  /** @type {WireError} */
  const error = { code, message, retryable: RETRYABLE_CODES.has(code) };
  if (details) error.details = details;
  return error;
}

/**
 * A failed ABPResponse built on this side of the wire (the server never saw the call,
 * or can no longer answer it).
 * @param {string} callId
 * @param {WireError} error
 * @param {number} [duration] ms
 * @returns {ABPResponse}
 */
export function failedResponse(callId, error, duration = 0) {
  return { callId, success: false, error, metadata: { duration: Math.round(duration) } };
}

/**
 * A cancelled ABPResponse built on this side: a signal that was aborted before the call
 * was sent, or a client closed under its calls.
 * @param {string} callId
 * @param {string} reason
 * @param {number} [duration] ms
 * @returns {ABPResponse}
 */
export function cancelledResponse(callId, reason, duration = 0) {
  return {
    ...failedResponse(callId, wireError(ErrorCode.CANCELLED, reason), duration),
    cancelled: true,
  };
}

/**
 * The reply to a request refused on this side, in the request's own reply type, or a
 * `notifications/error` when it has none (as the server answers).
 * @param {string | undefined} requestType
 * @param {string | undefined} requestId
 * @param {WireError} error
 * @param {string} [callId]
 * @returns {Envelope}
 */
export function errorReply(requestType, requestId, error, callId) {
  const replyType = requestType === undefined ? undefined : REPLY_TYPES[requestType];
  if (replyType === undefined || requestId === undefined) {
    /** @type {Record<string, any>} */
    const data = { ...error };
    if (requestId !== undefined) data.requestId = requestId;
    if (requestType !== undefined) data.requestType = String(requestType).slice(0, 80);
    return envelope(MessageType.NOTIFICATION, { event: "notifications/error", data });
  }
  if (replyType === MessageType.CALL_RESULT) {
    const response = failedResponse(callId ?? "", error);
    if (callId === undefined) delete response.callId;
    return envelope(replyType, response, requestId);
  }
  if (replyType === MessageType.CANCEL_RESULT && callId !== undefined) {
    return envelope(replyType, { callId, cancelled: false, error }, requestId);
  }
  return envelope(replyType, { error }, requestId);
}

/**
 * The subprotocols that carry a credential (an agent key or a page token): browsers
 * cannot set headers on a WebSocket, so it goes as `abp.bearer.<credential>`, offered
 * beside `abp`, which the app selects. A credential that is not a valid subprotocol
 * name (an RFC 7230 token) cannot be sent this way: TypeError.
 * @param {string} credential
 * @returns {string[]}
 */
export function bearerSubprotocols(credential) {
  if (!/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(credential)) {
    throw new TypeError(
      "This credential cannot be sent as a WebSocket subprotocol: only letters, digits and !#$%&'*+-.^_`|~ can.",
    );
  }
  return [SUBPROTOCOL, BEARER_SUBPROTOCOL_PREFIX + credential];
}

/**
 * The `error` of a refusal notice: the `notifications/error` (PERMISSION_DENIED, with
 * `details.reason`, answering no request) the app sends before it closes a connection
 * for its credential. Null for any other message.
 * @param {unknown} message
 * @returns {WireError | null}
 */
export function refusalNotice(message) {
  if (!isRecord(message) || message.type !== MessageType.NOTIFICATION || !isRecord(message.payload)) return null;
  const { event, data } = message.payload;
  if (event !== "notifications/error" || !isRecord(data) || data.code !== ErrorCode.PERMISSION_DENIED) return null;
  if (data.requestId !== undefined || !isRecord(data.details) || typeof data.details.reason !== "string") return null;
  return /** @type {WireError} */ (data);
}

/**
 * The error of a connection the app refused or cut off for its credential: closed with
 * 4401 or 4403, or with the close code its refusal notice announced. PERMISSION_DENIED,
 * not retryable, naming the reason (the close's, else the notice's); `details` keep
 * the close code and the reason. Null for any other close.
 * @param {number | undefined} code
 * @param {string | undefined} reason
 * @param {WireError | null} [notice] The refusal notice heard on the connection.
 * @returns {WireError | null}
 */
export function refusalError(code, reason, notice = null) {
  const announced = notice?.details?.closeCode === code ? String(notice?.details?.reason) : "";
  if (code !== CloseCode.UNAUTHORIZED && code !== CloseCode.FORBIDDEN && !announced) return null;
  const why = reason || announced || (code === CloseCode.FORBIDDEN ? "forbidden" : "unauthorized");
  return wireError(ErrorCode.PERMISSION_DENIED, `The app refused the connection: ${why}.`, {
    closeCode: code,
    reason: why,
  });
}

/**
 * Whether an error is the refusal of an expired page token, which a fresh token cures.
 * @param {unknown} error A WireError or an ABPError.
 */
export function isExpiredRefusal(error) {
  if (!isRecord(error) || error.code !== ErrorCode.PERMISSION_DENIED || !isRecord(error.details)) return false;
  return error.details.reason === Refusal.EXPIRED_CREDENTIALS;
}

/** A reason string from an AbortSignal's reason. @param {AbortSignal} signal */
export function abortReason(signal) {
  const reason = signal.reason;
  if (reason === undefined) return "Aborted";
  if (typeof reason === "string") return reason;
  if (reason instanceof Error) return reason.message || reason.name;
  return String(reason);
}

// --- binary -------------------------------------------------------------------------

/** @param {Uint8Array} bytes */
export function bytesToBase64(bytes) {
  const native = /** @type {any} */ (bytes).toBase64;
  if (typeof native === "function") return native.call(bytes);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode.apply(null, /** @type {any} */ (bytes.subarray(i, i + 0x8000)));
  }
  return btoa(text);
}

/** @param {string} text @returns {Uint8Array} */
export function base64ToBytes(text) {
  const native = /** @type {any} */ (Uint8Array).fromBase64;
  if (typeof native === "function") return native(text);
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

/** @param {unknown} value @returns {value is ArrayBuffer | ArrayBufferView | Blob} */
function isBinary(value) {
  return (
    value instanceof ArrayBuffer ||
    ArrayBuffer.isView(value) ||
    (typeof Blob !== "undefined" && value instanceof Blob)
  );
}

/** @param {ArrayBuffer | ArrayBufferView | Blob} value @returns {Promise<Uint8Array>} */
async function bytesOf(value) {
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  return new Uint8Array(await value.arrayBuffer());
}

const MAX_DEPTH = 32;

/** @param {unknown} value @returns {value is Record<string, unknown>} */
function isPlainObject(value) {
  if (typeof value !== "object" || value === null) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/**
 * A copy of `value` in which every binary input `{content: ArrayBuffer | view | Blob,
 * mimeType}` has become `{content: <base64>, mimeType, encoding: "base64"}`, the only
 * form JSON carries. Plain objects and arrays are copied; other values kept as they are.
 * @param {unknown} value
 * @returns {Promise<unknown>}
 */
export async function encodeBinaryInputs(value, depth = 0) {
  if (depth > MAX_DEPTH) return value;
  if (Array.isArray(value)) {
    return Promise.all(value.map((item) => encodeBinaryInputs(item, depth + 1)));
  }
  if (!isPlainObject(value)) return value;
  /** @type {Record<string, unknown>} */
  const out = {};
  for (const [key, item] of Object.entries(value)) {
    out[key] = await encodeBinaryInputs(item, depth + 1);
  }
  const content = value.content;
  if (isBinary(content)) {
    out.content = bytesToBase64(await bytesOf(content));
    out.encoding = "base64";
    if (out.mimeType === undefined && content instanceof Blob && content.type) {
      out.mimeType = content.type;
    }
  }
  return out;
}

/**
 * Turn the inline binary results of a call's `data` (one level inside it, as
 * `data.document` or `data.image`) into ArrayBuffers. Returns the new data and the
 * buffers, for a postMessage transfer list. References (`downloadUrl`) stay as they are.
 * @param {Record<string, any>} data
 * @returns {{data: Record<string, any>, buffers: ArrayBuffer[]}}
 */
export function decodeBinaryOutputs(data) {
  /** @type {ArrayBuffer[]} */
  const buffers = [];
  /** @type {Record<string, any>} */
  const out = { ...data };
  for (const [key, value] of Object.entries(data)) {
    if (isRecord(value) && value.encoding === "base64" && typeof value.content === "string") {
      const bytes = base64ToBytes(value.content);
      const buffer = /** @type {ArrayBuffer} */ (
        bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength
          ? bytes.buffer
          : bytes.slice().buffer
      );
      out[key] = { ...value, content: buffer, encoding: "arraybuffer" };
      buffers.push(buffer);
    }
  }
  return { data: out, buffers };
}
