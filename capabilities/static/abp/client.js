// @ts-check
/**
 * The agent-side ABP client: an ES module, no build step.
 *
 *   import { connect } from "https://jobs.example.com/static/abp/client.js";
 *   // over the iframe bridge (a page embedding https://jobs.example.com/abp/embed/):
 *   const client = await connect({ window: iframe.contentWindow, origin: "https://jobs.example.com" });
 *   // or straight over the WebSocket, with a credential (see connect()):
 *   const client = await connect({ url: "wss://jobs.example.com/abp/ws", token: process.env.ABP_KEY });
 *   await client.initialize({ agent: { name: "me", version: "1" } });
 *   const controller = new AbortController();
 *   const result = await client.call("export.pdf", { html }, { signal: controller.signal });
 *   if (result.cancelled) ...
 *
 * Binary inputs (`{content: ArrayBuffer | view | Blob | base64, mimeType}`) of 64 KiB
 * or more are uploaded first over a WebSocket (our extension, docs/uploads.md; see
 * uploads.js) and named by reference; smaller ones, and any whose upload fails, go
 * inline as base64.
 *
 * Every call settles exactly once with an ABPResponse; it never rejects. An aborted
 * signal (or `timeout`) sends `capabilities/cancel` and the call resolves with the
 * server's cancelled result; a signal aborted before the call sends nothing and the
 * call resolves at once with a cancelled response.
 *
 * A WebSocket that drops (close codes in RESUMABLE_CLOSE_CODES) does not end the
 * session: the client opens a new socket and resumes it (`initialize` with `resume`),
 * and the calls in flight get their results there, once. Calls and cancels made
 * meanwhile wait for the new socket. Only when the session cannot be resumed (the app
 * refuses, or `resume.graceMs` passes) does every pending call settle with error
 * DISCONNECTED (retryable), or PERMISSION_DENIED (not retryable) when the app refused
 * the connection's credential (close code 4401, 4403, or the one its refusal notice
 * names). Any other close settles them at once, the same way.
 * @module abp/client
 */

import {
  ABPError,
  BridgeMessageType,
  ErrorCode,
  MessageType,
  PROTOCOL_VERSION,
  REPLY_TYPES,
  RESUMABLE_CLOSE_CODES,
  RESUME_GRACE_MS,
  abortReason,
  bearerSubprotocols,
  cancelledResponse,
  decodeBinaryOutputs,
  encodeBinaryInputs,
  envelope,
  failedResponse,
  isExpiredRefusal,
  isRecord,
  newId,
  parseTextFrame,
  refusalError,
  refusalNotice,
  wireError,
} from "./wire.js";
import { uploadBinaryInputs, uploadUrl } from "./uploads.js";

export {
  ABPError,
  CloseCode,
  ErrorCode,
  MessageType,
  PROTOCOL_VERSION,
  RESUMABLE_CLOSE_CODES,
  RESUME_GRACE_MS,
  Refusal,
  isExpiredRefusal,
  newId,
} from "./wire.js";

/** @typedef {import("./wire.js").Envelope} Envelope */
/** @typedef {import("./wire.js").WireError} WireError */
/** @typedef {import("./wire.js").ABPResponse} ABPResponse */
/** @typedef {import("./wire.js").CancelResponse} CancelResponse */
/** @typedef {import("./wire.js").ProgressInfo} ProgressInfo */
/** @typedef {import("./wire.js").NotificationInfo} NotificationInfo */
/** @typedef {import("./wire.js").InitializeParams} InitializeParams */
/** @typedef {import("./wire.js").InitializeResult} InitializeResult */

/**
 * @typedef {object} CallOptions
 * @property {AbortSignal} [signal] Aborting it cancels the call.
 * @property {number} [timeout] ms; past it the call is cancelled, as by the signal.
 * @property {string | number} [progressToken] Ask for progress under this token.
 * @property {(progress: ProgressInfo) => void} [onProgress] This call's progress (a
 *   token is made up when none is given).
 * @property {string} [callId] Default: crypto.randomUUID().
 * @property {"base64" | "arraybuffer"} [binary] How inline binary results arrive:
 *   base64 text (the wire's form, the default) or ArrayBuffers. Over the bridge the
 *   buffers are made in the iframe and transferred, not copied.
 */

/**
 * @typedef {(asked: {expired: boolean}) => string | undefined | Promise<string | undefined>} TokenSource
 *   The credential for each socket: `expired` is true when the app refused the last
 *   one as expired (a page token: get a fresh one).
 */

/**
 * @typedef {{url: string, token?: string | TokenSource, resume?: boolean | {graceMs?: number}}
 *   | {window: Window, origin: string, timeout?: number}} ConnectTarget
 *   A WebSocket URL (`ws:`/`wss:`) and the credential to open it with, and whether a
 *   dropped socket's session is resumed (default: yes, tried for RESUME_GRACE_MS);
 *   or the window of an iframe showing /abp/embed/ and that iframe's origin (never
 *   "*": replies are accepted from that origin only; the bridge brings its own
 *   credential, and resumes its own socket).
 */

/**
 * @typedef {object} Resumer How an ABPClient resumes its session after a drop.
 * @property {(asked: {expired: boolean}) => Promise<Transport>} reopen A new, open
 *   transport to the same app (rejects when it cannot connect).
 * @property {number} graceMs How long to keep trying.
 */

/** @typedef {{code?: number, reason?: string}} CloseInfo */

/**
 * @typedef {object} Transport
 * @property {"websocket" | "window"} kind
 * @property {(message: Envelope) => Promise<void>} send
 * @property {() => void} close
 * @property {(message: unknown) => void} onmessage
 * @property {(info: CloseInfo) => void} onclose
 */

/**
 * How much later than the call's own `timeout` the server ends it by itself, should
 * the client's cancel never reach it (a frozen tab, a lost bridge).
 */
export const SERVER_TIMEOUT_GRACE_MS = 1000;
/** How long `shutdown()` waits for the server to close the session. */
export const SHUTDOWN_WAIT_MS = 5000;
/** How long `connect()` waits for the bridge of an iframe to answer. */
export const BRIDGE_WAIT_MS = 10000;
const HELLO_INTERVAL_MS = 200;
const WINDOW_WATCH_MS = 500;
/** The first wait between attempts to resume; it doubles up to RESUME_RETRY_MAX_MS. */
const RESUME_RETRY_MS = 100;
const RESUME_RETRY_MAX_MS = 2000;

const noop = () => {};

/**
 * The WebSocket: one envelope per text frame. The embed bridge relays on it too (it
 * serializes its own frames, to measure them and to replay them: `sendText`).
 */
export class WebSocketTransport {
  /** @param {string} url @param {string} [token] An agent key or a page token. */
  constructor(url, token) {
    /** @type {"websocket"} */
    this.kind = "websocket";
    this.url = url;
    this.token = token;
    /** @type {string[] | undefined} */
    this.protocols = token ? bearerSubprotocols(token) : undefined;
    /**
     * The session, once initialized: large binary inputs of its calls are uploaded
     * (uploads.js) and named by reference. @type {string | null}
     */
    this.sessionId = null;
    /** @type {WebSocket | null} */
    this.socket = null;
    /** @type {() => void} */
    this.markEnded = noop;
    /** Resolves once the close event has been handled. @type {Promise<void>} */
    this.ended = new Promise((resolve) => {
      this.markEnded = resolve;
    });
    /** @type {(message: unknown) => void} */
    this.onmessage = noop;
    /** @type {(info: CloseInfo) => void} */
    this.onclose = noop;
    // Binary inputs are encoded asynchronously (a Blob is read); frames keep their order.
    /** @type {Promise<void>} */
    this.queue = Promise.resolve();
  }

  get isOpen() {
    return this.socket !== null && this.socket.readyState === WebSocket.OPEN;
  }

  /**
   * Open the socket; a URL the WebSocket refuses throws at once. Resolves when it is
   * open; rejects (ABPError) when it closes first, which `onclose` hears too.
   * @returns {Promise<void>}
   */
  open() {
    const socket = new WebSocket(this.url, this.protocols);
    this.socket = socket;
    return new Promise((resolve, reject) => {
      let opened = false;
      socket.addEventListener(
        "open",
        () => {
          opened = true;
          resolve();
        },
        { once: true },
      );
      socket.addEventListener("message", (event) => {
        const message = parseTextFrame(event);
        if (message === undefined) return;
        this.onmessage(message);
      });
      socket.addEventListener(
        "close",
        (event) => {
          if (!opened) {
            const refused = refusalError(event.code, event.reason);
            reject(new ABPError(refused ?? wireError(ErrorCode.TRANSPORT_ERROR, `Could not connect to ${this.url}.`)));
          }
          try {
            this.onclose({ code: event.code, reason: event.reason });
          } finally {
            this.markEnded();
          }
        },
        { once: true },
      );
    });
  }

  /** @param {Envelope} message */
  send(message) {
    const sent = this.queue.then(async () => {
      const socket = this.socket;
      // Closing under us (the app may be refusing the credential): the close, with its
      // code, settles the request, not this send.
      if (socket !== null && socket.readyState >= WebSocket.CLOSING) await this.ended;
      if (socket === null || socket.readyState !== WebSocket.OPEN) {
        throw new ABPError(wireError(ErrorCode.DISCONNECTED, "The connection is closed."));
      }
      const text = JSON.stringify(await encodeBinaryInputs(await this.#withUploads(message)));
      socket.send(text);
    });
    this.queue = sent.catch(noop);
    return sent;
  }

  /**
   * A call whose large binary inputs were uploaded (in the queue: frames keep their order).
   * @param {Envelope} message
   * @returns {Promise<Envelope>}
   */
  async #withUploads(message) {
    if (message.type !== MessageType.CALL || this.sessionId === null || !isRecord(message.payload)) return message;
    const target = { url: uploadUrl(this.url), token: this.token, sessionId: this.sessionId };
    const params = await uploadBinaryInputs(message.payload.params, target);
    return { ...message, payload: { ...message.payload, params } };
  }

  /**
   * A frame as it is, now, past the queue: for a caller that sends nothing with
   * `send()`. Only while open.
   * @param {string} text
   */
  sendText(text) {
    /** @type {WebSocket} */ (this.socket).send(text);
  }

  /** @param {string} [reason] For the close frame. */
  close(reason) {
    this.socket?.close(1000, reason);
  }
}

/** postMessage to the window of an iframe showing /abp/embed/. */
class WindowTransport {
  /**
   * @param {Window} target
   * @param {string} origin
   */
  constructor(target, origin) {
    if (!origin || origin === "*") {
      throw new TypeError("connect(): the bridge's exact origin is required, never '*'.");
    }
    /** @type {"window"} */
    this.kind = "window";
    this.target = target;
    this.origin = new URL(origin).origin;
    /** @type {(message: unknown) => void} */
    this.onmessage = noop;
    /** @type {(info: CloseInfo) => void} */
    this.onclose = noop;
    /** @type {((message: Record<string, any>) => void) | null} */
    this.onready = null;
    this.listener = (/** @type {MessageEvent} */ event) => this.receive(event);
    window.addEventListener("message", this.listener);
    // An iframe removed from its page sends nothing more: notice it, so that no call
    // waits for a reply that cannot come.
    this.watch = setInterval(() => {
      if (this.target.closed) this.gone();
    }, WINDOW_WATCH_MS);
  }

  gone() {
    clearInterval(this.watch);
    window.removeEventListener("message", this.listener);
    this.onclose({ reason: "The bridge's window is gone." });
  }

  /** @param {MessageEvent} event */
  receive(event) {
    // Only the bridge's own window, from the bridge's own origin.
    if (event.source !== this.target || event.origin !== this.origin) return;
    const message = event.data;
    if (!isRecord(message)) return;
    if (message.type === BridgeMessageType.READY) {
      this.onready?.(message);
    } else if (message.type === BridgeMessageType.CLOSED) {
      const payload = isRecord(message.payload) ? message.payload : {};
      this.onclose({ code: payload.code, reason: payload.reason });
    } else {
      this.onmessage(message);
    }
  }

  /**
   * Wait for the bridge: it announces itself when it loads, and answers HELLO, which
   * is repeated in case it was posted while the iframe was still loading.
   * @param {number} timeout
   * @returns {Promise<Record<string, any>>}
   */
  open(timeout) {
    return new Promise((resolve, reject) => {
      const hello = () => this.post(envelope(BridgeMessageType.HELLO));
      const interval = setInterval(hello, HELLO_INTERVAL_MS);
      const timer = setTimeout(() => {
        finish();
        reject(new ABPError(wireError(ErrorCode.TRANSPORT_ERROR, `No ABP bridge answered from ${this.origin}.`)));
      }, timeout);
      const finish = () => {
        clearInterval(interval);
        clearTimeout(timer);
        this.onready = null;
      };
      this.onready = (message) => {
        finish();
        resolve(isRecord(message.payload) ? message.payload : {});
      };
      hello();
    });
  }

  /** @param {Envelope} message @param {Transferable[]} [transfer] */
  post(message, transfer = []) {
    if (this.target.closed) {
      this.gone();
      throw new ABPError(wireError(ErrorCode.DISCONNECTED, "The bridge's window is gone."));
    }
    this.target.postMessage(message, this.origin, transfer);
  }

  /** @param {Envelope} message */
  async send(message) {
    // Binary inputs travel as they are (structured clone); the bridge encodes them.
    try {
      this.post(message);
    } catch (error) {
      if (error instanceof ABPError) throw error;
      throw new ABPError(wireError(ErrorCode.INVALID_PARAMS, `Cannot post this message: ${error}`));
    }
  }

  close() {
    clearInterval(this.watch);
    window.removeEventListener("message", this.listener);
    if (!this.target.closed) this.target.postMessage(envelope(BridgeMessageType.DETACH), this.origin);
  }
}

/**
 * @typedef {object} Pending A request waiting for its reply.
 * @property {string} type The request's type.
 * @property {(payload: Record<string, any>) => void} settle With the reply's payload.
 * @property {(error: WireError) => void} fail Settled on this side.
 * @property {string} [callId]
 * @property {string} [token]
 * @property {(progress: ProgressInfo) => void} [onProgress]
 * @property {boolean} [cancelling]
 * @property {Envelope} [frame] A cancel's own frame: sent again after a resume, since
 *   its reply may have gone with the old socket.
 * @property {Envelope} [callFrame] A call's frame: sent again (marked `resent`) after a
 *   resume whose `heldCalls` does not list it: it was lost with the old socket.
 * @property {boolean} [sent] Handed to a transport (a call queued during a resume is not).
 */

/** One ABP session's worth of connection: calls, cancels, progress, notifications. */
export class ABPClient {
  /** @type {Transport} */
  #transport;
  /** Requests waiting for a reply, by envelope id. @type {Map<string, Pending>} */
  #pending = new Map();
  /** Envelope id of each pending call, by callId. @type {Map<string, string>} */
  #calls = new Map();
  /** Envelope id of each pending call, by progress token. @type {Map<string, string>} */
  #tokens = new Map();
  #closed = false;
  /**
   * What a request made after the close gets: DISCONNECTED, or PERMISSION_DENIED when
   * the app refused the credential.
   * @type {WireError}
   */
  #closeError = wireError(ErrorCode.DISCONNECTED, "The connection is closed.");
  /** Why the app is about to close the connection, when it said so. @type {WireError | null} */
  #refusal = null;
  /** @type {{progress: Set<Function>, notification: Set<Function>, envelope: Set<Function>, close: Set<Function>, resume: Set<Function>}} */
  #handlers = { progress: new Set(), notification: new Set(), envelope: new Set(), close: new Set(), resume: new Set() };
  /** How to resume after a drop; null: a drop ends the session. @type {Resumer | null} */
  #resumer;
  /** The session's current resume token. @type {string | null} */
  #resumeToken = null;
  /** What initialize sent (agent, features): sent again, with `resume`, to resume. @type {Record<string, any>} */
  #hello = {};
  /** Settles when the session is back on a new transport, or ended. @type {Promise<void> | null} */
  #resuming = null;
  /** The transport a resume is being tried on. @type {Transport | null} */
  #candidate = null;
  #shuttingDown = false;

  /**
   * @param {Transport} transport
   * @param {Record<string, any>} [bridge] READY's payload.
   * @param {Resumer | null} [resumer] How to resume the session after a drop.
   */
  constructor(transport, bridge = {}, resumer = null) {
    this.#transport = transport;
    this.#resumer = resumer;
    this.#attach(transport);
    /** The transport: "websocket" or "window". */
    this.transport = transport.kind;
    /** What the bridge announced (window transport): {protocolVersion, app, maxFrameBytes}. */
    this.bridge = bridge;
    /** @type {string | null} */
    this.sessionId = null;
    /** @type {InitializeResult | null} */
    this.session = null;
  }

  /**
   * Whether the transport has closed; calls then resolve at once with DISCONNECTED (or
   * PERMISSION_DENIED, when the app refused the credential).
   */
  get closed() {
    return this.#closed;
  }

  /**
   * Start the session. Rejects with an ABPError when the app refuses: PERMISSION_DENIED
   * when it refused the connection's credential.
   * @param {InitializeParams} [params]
   * @returns {Promise<InitializeResult>}
   */
  initialize(params = {}) {
    if (this.#closed) return Promise.reject(new ABPError(this.#closeError));
    const payload = {
      agent: { name: "abp-client.js", version: PROTOCOL_VERSION },
      protocolVersion: PROTOCOL_VERSION,
      ...params,
      features: { notifications: false, progress: true, elicitation: false, ...params.features },
    };
    return new Promise((resolve, reject) => {
      const id = newId();
      this.#request(id, {
        type: MessageType.INITIALIZE,
        settle: (reply) => {
          if (isRecord(reply.error)) {
            reject(new ABPError(/** @type {WireError} */ (reply.error)));
            return;
          }
          this.sessionId = reply.sessionId;
          if (this.#transport instanceof WebSocketTransport) this.#transport.sessionId = reply.sessionId ?? null;
          this.#resumeToken = typeof reply.resumeToken === "string" ? reply.resumeToken : null;
          const { resume, ...hello } = payload;
          this.#hello = hello;
          this.session = /** @type {InitializeResult} */ (reply);
          resolve(this.session);
        },
        fail: (error) => reject(new ABPError(error)),
      });
      this.#send(envelope(MessageType.INITIALIZE, payload, id));
    });
  }

  /**
   * Call a capability. Never rejects: resolves with the call's one ABPResponse.
   * @param {string} capability
   * @param {Record<string, any>} [params]
   * @param {CallOptions} [options]
   * @returns {Promise<ABPResponse>}
   */
  call(capability, params = {}, options = {}) {
    const { signal, timeout, onProgress, binary } = options;
    const callId = options.callId ?? newId();
    const started = performance.now();
    if (signal?.aborted) {
      return Promise.resolve(cancelledResponse(callId, abortReason(signal)));
    }
    if (this.#closed) return Promise.resolve(failedResponse(callId, this.#closeError));
    if (this.#calls.has(callId)) {
      const error = wireError(ErrorCode.INVALID_PARAMS, `callId ${JSON.stringify(callId)} is already running.`, {
        path: "payload.options.callId",
      });
      return Promise.resolve(failedResponse(callId, error));
    }
    const token = options.progressToken ?? (onProgress ? callId : undefined);
    /** @type {Record<string, any>} */
    const wireOptions = { callId };
    if (token !== undefined) wireOptions.progressToken = token;
    if (timeout !== undefined && timeout > 0) wireOptions.timeout = timeout + SERVER_TIMEOUT_GRACE_MS;
    const asBuffers = binary === "arraybuffer";
    // Over the bridge, the iframe makes the buffers and transfers them.
    if (asBuffers && this.#transport.kind === "window") wireOptions.binary = "arraybuffer";
    const id = newId();

    return new Promise((resolve) => {
      /** @type {ReturnType<typeof setTimeout> | undefined} */
      let timer;
      const cancelOnce = (/** @type {string} */ reason) => {
        const pending = this.#pending.get(id);
        if (pending === undefined || pending.cancelling) return;
        pending.cancelling = true;
        void this.cancel(callId, reason);
      };
      const onAbort = () => cancelOnce(abortReason(/** @type {AbortSignal} */ (signal)));
      const finish = (/** @type {ABPResponse} */ response) => {
        try {
          signal?.removeEventListener("abort", onAbort);
          clearTimeout(timer);
        } finally {
          resolve(response);
        }
      };
      const callFrame = envelope(MessageType.CALL, { capability, params, options: wireOptions }, id);
      this.#request(id, {
        type: MessageType.CALL,
        callId,
        callFrame,
        token: token === undefined ? undefined : String(token),
        onProgress,
        settle: (reply) => {
          /** @type {ABPResponse} */
          const response = /** @type {any} */ ({ callId, ...reply });
          if (asBuffers && this.#transport.kind === "websocket" && isRecord(response.data)) {
            response.data = decodeBinaryOutputs(response.data).data;
          }
          finish(response);
        },
        fail: (error) => finish(failedResponse(callId, error, performance.now() - started)),
      });
      signal?.addEventListener("abort", onAbort, { once: true });
      if (timeout !== undefined && timeout > 0) {
        timer = setTimeout(() => cancelOnce(`Timed out after ${timeout} ms.`), timeout);
      }
      this.#send(callFrame);
    });
  }

  /**
   * Cancel a call by its callId (also `cancel({callId, reason})`). Resolves with the
   * cancel-result; the call itself resolves with its own (cancelled) result.
   * @param {string | {callId: string, reason?: string}} callId
   * @param {string} [reason]
   * @returns {Promise<CancelResponse>}
   */
  cancel(callId, reason) {
    if (isRecord(callId)) ({ callId, reason } = /** @type {{callId: string, reason?: string}} */ (callId));
    const target = String(callId);
    if (this.#closed) {
      return Promise.resolve({ callId: target, cancelled: false, error: this.#closeError });
    }
    return new Promise((resolve) => {
      const id = newId();
      /** @type {Record<string, any>} */
      const payload = { callId: target };
      if (reason) payload.reason = String(reason);
      const frame = envelope(MessageType.CANCEL, payload, id);
      this.#request(id, {
        type: MessageType.CANCEL,
        frame,
        settle: (reply) => resolve(/** @type {CancelResponse} */ ({ callId: target, cancelled: false, ...reply })),
        fail: (error) => resolve({ callId: target, cancelled: false, error }),
      });
      this.#send(frame);
    });
  }

  /**
   * End the session: the app cancels and answers every call in flight, then closes.
   * Resolves once the transport has closed (or after SHUTDOWN_WAIT_MS, closing it).
   * @param {{reason?: string}} [params]
   * @returns {Promise<void>}
   */
  shutdown(params = {}) {
    if (this.#closed) return Promise.resolve();
    this.#shuttingDown = true;
    if (this.sessionId === null) {
      // No session to end: the app would answer NOT_INITIALIZED and keep the socket.
      this.close(params.reason);
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#handlers.close.delete(done);
        resolve();
      };
      const timer = setTimeout(() => this.close("The app did not end the session in time."), SHUTDOWN_WAIT_MS);
      this.#handlers.close.add(done);
      this.#send(envelope(MessageType.SHUTDOWN, params.reason ? { reason: String(params.reason) } : {}));
    });
  }

  /**
   * Close at once: pending calls resolve as cancelled on this side; the app cancels
   * them too (a closed WebSocket; over the bridge, DETACH).
   * @param {string} [reason]
   */
  close(reason = "The client closed.") {
    if (this.#closed) return;
    this.#transport.close();
    this.#candidate?.close();
    this.#transportClosed({ reason }, reason);
  }

  /**
   * Every `progress` message. @param {(progress: ProgressInfo) => void} handler
   * @returns {() => void} Unsubscribes.
   */
  onProgress(handler) {
    return this.#subscribe("progress", handler);
  }

  /**
   * Every `notification` message. @param {(notification: NotificationInfo) => void} handler
   * @returns {() => void} Unsubscribes.
   */
  onNotification(handler) {
    return this.#subscribe("notification", handler);
  }

  /**
   * Every envelope sent ("out") and received ("in"), for logs.
   * @param {(direction: "in" | "out", message: Record<string, any>) => void} handler
   * @returns {() => void} Unsubscribes.
   */
  onEnvelope(handler) {
    return this.#subscribe("envelope", handler);
  }

  /**
   * The transport closed for good (not a drop the session was resumed after).
   * @param {(info: CloseInfo) => void} handler
   * @returns {() => void} Unsubscribes.
   */
  onClose(handler) {
    return this.#subscribe("close", handler);
  }

  /**
   * The session was resumed on a new socket after a drop.
   * @param {(info: {sessionId: string, dropped: CloseInfo}) => void} handler
   * @returns {() => void} Unsubscribes.
   */
  onResume(handler) {
    return this.#subscribe("resume", handler);
  }

  // --- internals -------------------------------------------------------------------

  /** @param {"progress" | "notification" | "envelope" | "close" | "resume"} kind @param {Function} handler */
  #subscribe(kind, handler) {
    const set = this.#handlers[kind];
    set.add(handler);
    return () => set.delete(handler);
  }

  /** @param {"progress" | "notification" | "envelope" | "close" | "resume"} kind @param {...any} args */
  #emit(kind, ...args) {
    for (const handler of [...this.#handlers[kind]]) {
      try {
        handler(...args);
      } catch (error) {
        console.error("ABP client: a handler threw", error);
      }
    }
  }

  /** @param {string} id @param {Pending} pending */
  #request(id, pending) {
    this.#pending.set(id, pending);
    if (pending.callId !== undefined) this.#calls.set(pending.callId, id);
    if (pending.token !== undefined) this.#tokens.set(pending.token, id);
  }

  /** Remove a pending request from every map before it settles, so it settles once. @param {string} id */
  #take(id) {
    const pending = this.#pending.get(id);
    if (pending === undefined) return undefined;
    this.#pending.delete(id);
    if (pending.callId !== undefined && this.#calls.get(pending.callId) === id) this.#calls.delete(pending.callId);
    if (pending.token !== undefined && this.#tokens.get(pending.token) === id) this.#tokens.delete(pending.token);
    return pending;
  }

  /** The transport's messages and close are this client's. @param {Transport} transport */
  #attach(transport) {
    this.#transport = transport;
    transport.onmessage = (message) => this.#receive(message);
    transport.onclose = (info) => {
      if (transport === this.#transport) this.#transportClosed(info);
    };
  }

  /** Sent now, or on the resumed transport while a resume is under way. @param {Envelope} message */
  #send(message) {
    this.#emit("envelope", "out", message);
    const fail = (/** @type {unknown} */ error) => {
      const wire = error instanceof ABPError ? error : null;
      this.#take(message.id)?.fail(
        wireError(wire?.code ?? ErrorCode.TRANSPORT_ERROR, wire?.message ?? String(error), wire?.details),
      );
    };
    const go = () => {
      const pending = this.#pending.get(String(message.id));
      if (pending !== undefined) pending.sent = true;
      return this.#transport.send(message);
    };
    if (this.#resuming === null) {
      go().catch(fail);
    } else {
      this.#resuming.then(go).catch(fail);
    }
  }

  /** @param {unknown} message */
  #receive(message) {
    if (!isRecord(message) || typeof message.type !== "string") return;
    this.#emit("envelope", "in", message);
    const payload = isRecord(message.payload) ? message.payload : {};
    if (message.type === MessageType.PROGRESS) {
      const id = this.#tokens.get(String(payload.operationId));
      const onProgress = id === undefined ? undefined : this.#pending.get(id)?.onProgress;
      if (onProgress) {
        try {
          onProgress(/** @type {ProgressInfo} */ (payload));
        } catch (error) {
          console.error("ABP client: onProgress threw", error);
        }
      }
      this.#emit("progress", payload);
      return;
    }
    if (message.type === MessageType.NOTIFICATION) {
      // A request the app could not read is answered by notifications/error naming it.
      const data = isRecord(payload.data) ? payload.data : {};
      this.#refusal = refusalNotice(message) ?? this.#refusal;
      if (payload.event === "notifications/error" && typeof data.requestId === "string") {
        const { requestId, requestType, ...error } = data;
        this.#take(requestId)?.fail(/** @type {WireError} */ (error));
      }
      this.#emit("notification", payload);
      return;
    }
    const id = String(message.id);
    const pending = this.#pending.get(id);
    if (pending === undefined || REPLY_TYPES[pending.type] !== message.type) return; // late or foreign: dropped
    this.#take(id)?.settle(payload);
  }

  /** @param {CloseInfo} info */
  #resumable(info) {
    return (
      this.#resumer !== null &&
      this.#resuming === null &&
      !this.#shuttingDown &&
      this.sessionId !== null &&
      this.#resumeToken !== null &&
      this.#refusal === null &&
      info.code !== undefined &&
      RESUMABLE_CLOSE_CODES.includes(info.code)
    );
  }

  /**
   * The socket dropped: keep the calls, take the session back on a new transport.
   * Requests other than calls and cancels had their replies on the old socket: they
   * fail now.
   * @param {CloseInfo} dropped
   */
  #resume(dropped) {
    const lost = wireError(ErrorCode.DISCONNECTED, `The connection dropped (${dropped.code}) before the reply.`);
    for (const [id, pending] of [...this.#pending]) {
      if (pending.type !== MessageType.CALL && pending.type !== MessageType.CANCEL) this.#take(id)?.fail(lost);
    }
    this.#resuming = this.#resumeSession(dropped).finally(() => {
      this.#resuming = null;
    });
  }

  /**
   * Try to resume until it works, the app refuses, or the grace period is over; in the
   * last two cases the session ends as a close would end it.
   * @param {CloseInfo} dropped
   */
  async #resumeSession(dropped) {
    const resumer = /** @type {Resumer} */ (this.#resumer);
    const outcome = await keepResuming(
      async (asked) => {
        const transport = await resumer.reopen(asked);
        this.#candidate = transport;
        try {
          return await this.#handshake(transport);
        } finally {
          this.#candidate = null;
          if (this.#closed) transport.close();
        }
      },
      resumer.graceMs,
      () => this.#closed,
    );
    if (this.#closed) return;
    if (outcome.resumed) {
      // Before anything queued meanwhile: a cancel made during the drop follows its call.
      const held = outcome.heldCalls === undefined ? null : new Set(outcome.heldCalls);
      for (const pending of [...this.#pending.values()]) {
        const lost = held !== null && pending.sent && pending.callFrame && !held.has(String(pending.callId));
        if (lost) this.#sendAgain(resentCall(/** @type {Envelope} */ (pending.callFrame)));
      }
      for (const pending of [...this.#pending.values()]) if (pending.frame) this.#sendAgain(pending.frame);
      this.#emit("resume", { sessionId: this.sessionId, dropped });
      return;
    }
    const refused = outcome.error;
    if (refused?.code === ErrorCode.PERMISSION_DENIED) {
      this.#transportClosed(dropped, undefined, refused);
      return;
    }
    const reason = refused === undefined ? outcome.why : `${refused.code}: ${refused.message}`;
    const message = `The connection closed (${dropped.code}) and the session could not be resumed: ${reason}.`;
    this.#transportClosed(dropped, undefined, wireError(ErrorCode.DISCONNECTED, message));
  }

  /** On the resumed transport, now. @param {Envelope} message */
  #sendAgain(message) {
    this.#emit("envelope", "out", message);
    this.#transport.send(message).catch((/** @type {unknown} */ error) => {
      this.#take(String(message.id))?.fail(wireError(ErrorCode.TRANSPORT_ERROR, String(error)));
    });
  }

  /**
   * Resume the session on `transport`: on success it is this client's transport.
   * @param {Transport} transport
   */
  #handshake(transport) {
    const awaiting = [...this.#pending.values()].flatMap((pending) =>
      pending.type === MessageType.CALL && pending.sent && pending.callId !== undefined ? [pending.callId] : [],
    );
    const session = { sessionId: this.sessionId, token: this.#resumeToken, awaiting };
    return resumeOn(transport, this.#hello, session, (resumeToken) => {
      this.#resumeToken = resumeToken;
      if (transport instanceof WebSocketTransport) transport.sessionId = this.sessionId;
      this.#attach(transport);
    });
  }

  /**
   * @param {CloseInfo} info
   * @param {string} [cancelReason] Set when this side closed.
   * @param {WireError} [ended] Why a session that could not be resumed ended.
   */
  #transportClosed(info, cancelReason, ended) {
    if (this.#closed) return;
    if (cancelReason === undefined && ended === undefined && this.#resumable(info)) {
      this.#resume(info);
      return;
    }
    this.#closed = true;
    const refused = ended?.code === ErrorCode.PERMISSION_DENIED ? ended : refusalError(info.code, info.reason, this.#refusal);
    if (refused !== null) this.#closeError = refused;
    const error =
      refused ??
      ended ??
      wireError(ErrorCode.DISCONNECTED, `The connection closed${info.code ? ` (${info.code})` : ""} before the reply.`);
    for (const id of [...this.#pending.keys()]) {
      const pending = this.#take(id);
      if (pending === undefined) continue;
      if (cancelReason !== undefined && pending.type === MessageType.CALL && pending.callId !== undefined) {
        pending.settle(/** @type {any} */ (cancelledResponse(pending.callId, cancelReason)));
      } else {
        pending.fail(error);
      }
    }
    this.sessionId = null;
    if (this.#transport instanceof WebSocketTransport) this.#transport.sessionId = null;
    this.#emit("close", info);
  }
}

/**
 * Try `attempt` until it resumes a session, the app refuses it, `graceMs` passes, or
 * `stopped()`: at once, then after RESUME_RETRY_MS, doubling up to
 * RESUME_RETRY_MAX_MS. A credential refused as expired is tried once more at once,
 * with `expired: true` (a page token: get a fresh one). A try that throws (no socket
 * opened) counts as failed; one that throws PERMISSION_DENIED, as refused.
 * @param {(asked: {expired: boolean}) => Promise<ResumeOutcome>} attempt
 * @param {number} graceMs
 * @param {() => boolean} stopped
 * @returns {Promise<ResumeOutcome & {why?: string}>} `error`: the refusal; `why`: why
 *   nothing worked.
 */
export async function keepResuming(attempt, graceMs, stopped) {
  const deadline = performance.now() + graceMs;
  let delay = RESUME_RETRY_MS;
  let expired = false;
  let why = "the grace period ended";
  while (!stopped() && performance.now() < deadline) {
    /** @type {ResumeOutcome} */
    let outcome;
    try {
      outcome = await attempt({ expired });
    } catch (error) {
      const wire = error instanceof ABPError ? wireError(error.code, error.message, error.details) : null;
      outcome = wire?.code === ErrorCode.PERMISSION_DENIED ? { error: wire } : { closed: { reason: wire?.message ?? String(error) } };
    }
    if (stopped() || outcome.resumed) return outcome;
    if (outcome.error !== undefined) {
      if (expired || !isExpiredRefusal(outcome.error)) return { error: outcome.error };
      expired = true;
      continue;
    }
    why = outcome.closed?.reason || `the new connection closed (${outcome.closed?.code})`;
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, Math.min(delay, deadline - performance.now()))));
    delay = Math.min(delay * 2, RESUME_RETRY_MAX_MS);
  }
  return { why };
}

/**
 * @typedef {object} ResumeOutcome How one try to resume went.
 * @property {true} [resumed]
 * @property {string[]} [heldCalls] Of the calls awaited, those the app holds (absent
 *   from an app without the extension: then none is sent again).
 * @property {WireError} [error] The app refused the resume or the credential.
 * @property {CloseInfo} [closed] The transport closed first for another reason.
 */

/**
 * The call's frame marked as sent again after a resume: the app runs it unless it
 * holds its callId already (docs/protocol.md, resuming a session).
 * @param {Envelope} frame
 * @returns {Envelope}
 */
export function resentCall(frame) {
  const payload = isRecord(frame.payload) ? frame.payload : {};
  const options = isRecord(payload.options) ? payload.options : {};
  return { ...frame, payload: { ...payload, options: { ...options, resent: true } } };
}

/**
 * Resume a session on an open transport: `initialize` with `resume` and the first
 * initialize's `hello` (agent, features). On success `attach` gets the new resume
 * token and runs before any later message is read (the results that waited come
 * next); the initialize-result goes nowhere else.
 * @param {Transport} transport
 * @param {Record<string, any>} hello
 * @param {{sessionId: string | null, token: string | null, awaiting?: string[]}} session
 *   `awaiting`: the callIds sent and still waiting for their answer.
 * @param {(resumeToken: string | null) => void} attach
 * @returns {Promise<ResumeOutcome>}
 */
export function resumeOn(transport, hello, session, attach) {
  return new Promise((resolve) => {
    const id = newId();
    /** @type {WireError | null} */
    let notice = null;
    transport.onmessage = (message) => {
      if (!isRecord(message)) return;
      if (message.type !== MessageType.INITIALIZE_RESULT || message.id !== id) {
        notice = refusalNotice(message) ?? notice;
        return;
      }
      const reply = isRecord(message.payload) ? message.payload : {};
      if (isRecord(reply.error)) {
        transport.close();
        resolve({ error: /** @type {WireError} */ (reply.error) });
        return;
      }
      attach(typeof reply.resumeToken === "string" ? reply.resumeToken : null);
      const held = Array.isArray(reply.heldCalls) ? reply.heldCalls.map(String) : undefined;
      resolve(held === undefined ? { resumed: true } : { resumed: true, heldCalls: held });
    };
    transport.onclose = (info) => {
      const refused = refusalError(info.code, info.reason, notice);
      resolve(refused === null ? { closed: info } : { error: refused });
    };
    /** @type {Record<string, any>} */
    const resume = { sessionId: session.sessionId, token: session.token };
    if (session.awaiting?.length) resume.awaiting = session.awaiting;
    const payload = { ...hello, resume };
    transport.send(envelope(MessageType.INITIALIZE, payload, id)).catch(() => {}); // its close answers
  });
}

/**
 * Connect to an ABP app over a WebSocket or through an iframe's bridge.
 *
 * Over a WebSocket the app wants a credential (unless it allows anonymous access):
 * `token` is an agent key (`abp_...`, from the app's admin) or a page token (what the
 * app's own pages render; see page_token.js). It is sent as the WebSocket subprotocol
 * `abp.bearer.<token>`, beside `abp`, which is how a browser can send one. An agent
 * running in Node 22 (whose global WebSocket is the standard one):
 *
 *   import { connect } from "./client.js";
 *   const client = await connect({ url: "wss://jobs.example.com/abp/ws", token: process.env.ABP_KEY });
 *
 * Never ship an agent key in a public page: anyone who can read the page can use the
 * key. Pages on another site embed /abp/embed/ instead (`{window, origin}`), whose
 * bridge connects with a page token of its own.
 *
 * The app accepts the connection before it checks the credential. A refused one gets a
 * `notifications/error` naming the reason, then is closed (4401; 4403 when a key is
 * revoked later), and every request on it fails with PERMISSION_DENIED naming the
 * reason ("The app refused the connection: invalid-credentials.", `error.details.reason`
 * one of `Refusal`), so `initialize()` rejects with it.
 * @param {ConnectTarget} target
 * @returns {Promise<ABPClient>} Rejects (ABPError, TRANSPORT_ERROR) if it cannot connect.
 */
export async function connect(target) {
  if ("url" in target) {
    const { url, token, resume = true } = target;
    const reopen = async (asked = { expired: false }) => {
      const transport = new WebSocketTransport(url, typeof token === "function" ? await token(asked) : token);
      await transport.open();
      return transport;
    };
    const transport = await reopen();
    if (resume === false) return new ABPClient(transport);
    const graceMs = typeof resume === "object" && resume.graceMs !== undefined ? resume.graceMs : RESUME_GRACE_MS;
    return new ABPClient(transport, {}, { reopen, graceMs });
  }
  const transport = new WindowTransport(target.window, target.origin);
  try {
    const ready = await transport.open(target.timeout ?? BRIDGE_WAIT_MS);
    return new ABPClient(transport, ready);
  } catch (error) {
    transport.close();
    throw error;
  }
}
