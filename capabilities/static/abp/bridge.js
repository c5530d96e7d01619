// @ts-check
/**
 * The postMessage bridge of /abp/embed/: relays ABP envelopes between the page that
 * embeds this iframe (the parent) and the app's WebSocket.
 *
 * - Only messages from the parent window, from an allowed origin (the server renders
 *   the list; the app's own origin is always allowed), are read; others are ignored
 *   (logged to the console, never answered). Replies go to the parent with that exact
 *   origin as targetOrigin, never "*".
 * - A message that cannot be relayed (not an envelope, not serializable, too large)
 *   is answered here with a coded error, as the server answers a bad frame.
 * - Binary inputs posted as ArrayBuffers (or views, or Blobs, or base64) of 64 KiB or
 *   more are uploaded to the app (our extension, docs/uploads.md; uploads.js) with
 *   the page token and the session the bridge saw initialized, and relayed as their
 *   reference; smaller ones, and any whose upload failed, are encoded to base64
 *   before relaying. A call whose options say `binary: "arraybuffer"` (an option of
 *   this bridge, removed before relaying) gets its inline binary results back as
 *   ArrayBuffers, transferred (no copy).
 * - Cancellation goes hop by hop: a capabilities/cancel from the parent is relayed;
 *   when the parent goes away (this page is hidden for good) or detaches (DETACH),
 *   the bridge cancels every call it relayed and ends the session before closing.
 * - The socket is opened on the first envelope and kept while the session lives.
 *   When it drops (a close code in RESUMABLE_CLOSE_CODES: the network, a restarted
 *   server), the bridge opens a new one and resumes the session on it, as client.js
 *   does: the parent sees nothing but its calls' results, once. Messages from the
 *   parent wait for the new socket; cancels whose replies may have been lost are sent
 *   again. Only when the session cannot be resumed (the app refuses it, or the grace
 *   period passes), or the socket closes for another reason, is every request still
 *   waiting answered (DISCONNECTED) and the parent told (CLOSED). The next envelope
 *   then opens a new socket.
 * - The socket carries the page token the server rendered into the config (as its
 *   subprotocol); a token older than half its max age is first replaced by a fresh
 *   one from the token URL. A socket the app refuses as `expired-credentials` before
 *   it said anything is opened once more with a fresh token and the same frames (the
 *   app read none of them). Any other refusal (close code 4401, or 4403 for a key
 *   revoked) answers the requests still waiting with PERMISSION_DENIED.
 * @module abp/bridge
 */

import { WebSocketTransport, keepResuming, resentCall, resumeOn } from "./client.js";
import { PageToken } from "./page_token.js";
import { uploadBinaryInputs, uploadUrl } from "./uploads.js";
import {
  BridgeMessageType,
  ErrorCode,
  MessageType,
  REPLY_TYPES,
  RESUMABLE_CLOSE_CODES,
  RESUME_GRACE_MS,
  decodeBinaryOutputs,
  encodeBinaryInputs,
  envelope,
  errorReply,
  isExpiredRefusal,
  isRecord,
  newId,
  refusalError,
  refusalNotice,
  wireError,
} from "./wire.js";

// The page, and with it its token, came no later than this.
const loadedAt = Date.now();

/** @typedef {import("./wire.js").Envelope} Envelope */
/** @typedef {import("./wire.js").WireError} WireError */
/** @typedef {import("./client.js").CloseInfo} CloseInfo */

/**
 * @typedef {object} BridgeConfig Rendered by the server into #abp-embed-config.
 * @property {string} endpoint The WebSocket path, e.g. /abp/ws.
 * @property {string[]} allowedOrigins Exact origins, or scheme://host:* for any port.
 * @property {number} maxFrameBytes The server's frame limit.
 * @property {string} protocolVersion
 * @property {Record<string, string>} app
 * @property {string} [token] A page token for this page's origin.
 * @property {string} [tokenUrl] Where a fresh page token comes from (same origin).
 * @property {number} [tokenMaxAgeSeconds] How long a page token lasts.
 */

/**
 * @typedef {object} Relayed A request relayed to the server, waiting for its reply.
 * @property {string} type
 * @property {string} [callId]
 * @property {boolean} [buffers] Binary results as transferred ArrayBuffers.
 * @property {string} [frame] A cancel's frame: sent again after a resume.
 * @property {string} [callFrame] A call's frame: sent again, marked `resent`, after a
 *   resume whose `heldCalls` does not list it (it was lost with the old socket).
 */


/**
 * Whether `origin` may talk to this bridge.
 * @param {string} origin
 * @param {string[]} allowed Exact origins, or scheme://host:* (any port).
 * @param {string} own This page's origin, always allowed.
 */
export function originAllowed(origin, allowed, own = location.origin) {
  if (typeof origin !== "string" || origin === "null") return false;
  if (origin === own) return true;
  return allowed.some((pattern) => {
    if (pattern === origin) return true;
    if (!pattern.endsWith(":*")) return false;
    const base = pattern.slice(0, -2);
    return origin === base || (origin.startsWith(`${base}:`) && /^\d{1,5}$/.test(origin.slice(base.length + 1)));
  });
}

/** The origin of the page that embeds this one, when the browser tells. */
function embedderOrigin() {
  const ancestors = /** @type {any} */ (location).ancestorOrigins;
  if (ancestors && ancestors.length > 0) return String(ancestors[0]);
  try {
    return document.referrer ? new URL(document.referrer).origin : null;
  } catch {
    return null;
  }
}

/** The UTF-8 size of a frame. @param {string} text */
function byteLength(text) {
  return new Blob([text]).size;
}

/** @param {unknown} id @returns {string | undefined} */
function readableId(id) {
  if ((typeof id === "string" && id.length > 0) || (typeof id === "number" && Number.isInteger(id))) {
    return String(id);
  }
  return undefined;
}

export class Bridge {
  /** @type {BridgeConfig} */
  #config;
  /** @type {Window} */
  #parent;
  /** The parent's origin, once a message from it was accepted: replies go there. @type {string | null} */
  #origin = null;
  /** @type {WebSocketTransport | null} */
  #socket = null;
  /** A page token is being fetched; the socket opens when it comes. */
  #starting = false;
  /** Bumped when the parent leaves: a socket still waiting for its token never opens. */
  #generation = 0;
  /** @type {PageToken} */
  #token;
  /** Frames waiting for the socket to open. @type {string[]} */
  #queue = [];
  /** Frames sent on the socket before the app said anything on it. @type {string[] | null} */
  #unheard = null;
  /** The socket is the one retry with a fresh token. */
  #retrying = false;
  /**
   * The app's refusal notice, held until the socket closes: passed on then, or dropped
   * when a retry with a fresh token follows.
   * @type {Record<string, any> | null}
   */
  #refusal = null;
  /** The session the app opened on the socket (initialize-result), for uploads. @type {string | null} */
  #sessionId = null;
  /** Its current resume token. @type {string | null} */
  #resumeToken = null;
  /** What the parent's initialize said (agent, features): sent again to resume. @type {Record<string, any>} */
  #hello = {};
  /** The session is being resumed on a new socket. */
  #resuming = false;
  /** Relayed requests waiting for their reply, by envelope id. @type {Map<string, Relayed>} */
  #relayed = new Map();
  // Messages are handled in order in each direction, though some steps are async
  // (reading a Blob, fetching a result): a cancel never overtakes its call.
  #inbound = Promise.resolve();
  #outbound = Promise.resolve();

  /** @param {BridgeConfig} config @param {Window} [parent] */
  constructor(config, parent = window.parent) {
    this.#config = config;
    this.#parent = parent;
    this.#token = new PageToken({
      token: config.token,
      url: config.tokenUrl,
      maxAgeSeconds: config.tokenMaxAgeSeconds,
      issuedAt: loadedAt,
    });
  }

  start() {
    window.addEventListener("message", (event) => this.#onMessage(event));
    // The parent navigated away, closed, or removed this iframe.
    window.addEventListener("pagehide", () => this.#leave("The embedding page went away."));
    const origin = embedderOrigin();
    if (origin !== null && this.#allows(origin)) this.#announce(origin);
  }

  /** @param {string} origin */
  #allows(origin) {
    return originAllowed(origin, this.#config.allowedOrigins);
  }

  /** @param {string} origin */
  #announce(origin) {
    const { protocolVersion, app, maxFrameBytes } = this.#config;
    this.#parent.postMessage(envelope(BridgeMessageType.READY, { protocolVersion, app, maxFrameBytes }), origin);
  }

  /** @param {MessageEvent} event */
  #onMessage(event) {
    if (!this.#allows(event.origin)) {
      console.warn(`ABP bridge: ignored a message from ${event.origin}: origin not allowed.`);
      return;
    }
    if (event.source !== this.#parent || this.#parent === window) {
      console.warn(`ABP bridge: ignored a message from ${event.origin}: not from the embedding page.`);
      return;
    }
    this.#origin = event.origin;
    const data = event.data;
    this.#inbound = this.#inbound
      .then(() => this.#handle(data))
      .catch((error) => console.error("ABP bridge: could not handle a message", error));
  }

  /** Post to the parent, at its exact origin. @param {Record<string, any>} message @param {Transferable[]} [transfer] */
  #toParent(message, transfer = []) {
    if (this.#origin === null) return;
    this.#parent.postMessage(message, this.#origin, transfer);
  }

  /** @param {unknown} data */
  async #handle(data) {
    let message = data;
    if (typeof message === "string") {
      // Lenient: a frame as text is read as the server would read it.
      try {
        message = JSON.parse(message);
      } catch {
        this.#toParent(errorReply(undefined, undefined, wireError(ErrorCode.PARSE_ERROR, "Message is not valid JSON.")));
        return;
      }
    }
    if (!isRecord(message)) {
      const error = wireError(ErrorCode.PARSE_ERROR, "A message must be an ABP envelope (an object).");
      this.#toParent(errorReply(undefined, undefined, error));
      return;
    }
    const type = typeof message.type === "string" ? message.type : undefined;
    const id = readableId(message.id);
    if (type?.startsWith("abp-bridge/")) {
      this.#control(type, id);
      return;
    }
    /** @type {Relayed} */
    let relayed = { type: type ?? "" };
    let payload = message.payload;
    if (type === MessageType.CALL && isRecord(payload)) {
      const prepared = this.#prepareCall(payload);
      payload = prepared.payload;
      relayed = { type, callId: prepared.callId, buffers: prepared.buffers };
    }
    const refuse = (/** @type {WireError} */ error) => this.#toParent(errorReply(type, id, error, relayed.callId));
    try {
      if (type === MessageType.CALL && isRecord(payload)) payload = await this.#withUploads(payload);
      payload = await encodeBinaryInputs(payload);
    } catch (error) {
      refuse(wireError(ErrorCode.INVALID_PARAMS, `A binary input could not be read: ${error}`));
      return;
    }
    let text;
    try {
      text = JSON.stringify({ ...message, timestamp: message.timestamp ?? Date.now(), payload });
    } catch (error) {
      refuse(wireError(ErrorCode.PARSE_ERROR, `Message cannot be sent as JSON: ${error}`));
      return;
    }
    const size = byteLength(text);
    if (size > this.#config.maxFrameBytes) {
      refuse(
        wireError(ErrorCode.INVALID_PARAMS, `Message is ${size} bytes; the limit is ${this.#config.maxFrameBytes}.`, {
          limit: this.#config.maxFrameBytes,
          size,
        }),
      );
      return;
    }
    if (type === MessageType.INITIALIZE && isRecord(payload)) {
      const { resume, ...hello } = payload;
      this.#hello = hello;
    }
    if (type === MessageType.CANCEL) relayed = { ...relayed, frame: text };
    if (type === MessageType.CALL) relayed = { ...relayed, callFrame: text };
    if (type !== undefined && id !== undefined && type in REPLY_TYPES) this.#relayed.set(id, relayed);
    this.#relay(text);
  }

  /**
   * The call's payload, its large binary inputs uploaded (the same origin as this page).
   * @param {Record<string, any>} payload
   */
  async #withUploads(payload) {
    if (this.#sessionId === null || this.#socket === null) return payload;
    const target = { url: uploadUrl(this.#socket.url), token: await this.#token.get(), sessionId: this.#sessionId };
    return { ...payload, params: await uploadBinaryInputs(payload.params, target) };
  }

  /**
   * Take out this bridge's own option and make sure the callId is known here (the
   * server would make one up otherwise), so a parent that leaves can be cancelled for.
   * @param {Record<string, any>} payload
   */
  #prepareCall(payload) {
    const options = isRecord(payload.options) ? { ...payload.options } : {};
    const buffers = options.binary === "arraybuffer";
    delete options.binary;
    let callId = typeof payload.callId === "string" ? payload.callId : options.callId;
    if (callId === undefined) {
      callId = newId();
      options.callId = callId;
    }
    return { payload: { ...payload, options }, callId: typeof callId === "string" ? callId : undefined, buffers };
  }

  /** @param {string} type @param {string | undefined} id */
  #control(type, id) {
    if (type === BridgeMessageType.HELLO) {
      this.#announce(/** @type {string} */ (this.#origin));
    } else if (type === BridgeMessageType.DETACH) {
      this.#leave("The parent detached.");
    } else {
      const error = wireError(ErrorCode.UNKNOWN_MESSAGE_TYPE, `Unknown bridge message ${JSON.stringify(type)}.`);
      this.#toParent(errorReply(type, id, error));
    }
  }

  // --- the socket --------------------------------------------------------------------

  /** @param {string} text */
  #relay(text) {
    const socket = this.#socket;
    if (socket !== null && socket.isOpen) {
      this.#send(socket, text);
      return;
    }
    this.#queue.push(text);
    if (socket === null && !this.#starting && !this.#resuming) void this.#connect();
  }

  /** @param {WebSocketTransport} socket @param {string} text */
  #send(socket, text) {
    socket.sendText(text);
    this.#unheard?.push(text);
  }

  /**
   * Get a page token, then open the socket. `refused` is the close that asked for a
   * fresh token: when none comes, the requests waiting are answered with its refusal.
   * @param {CloseInfo & {notice: Record<string, any> | null}} [refused]
   */
  async #connect(refused) {
    const generation = this.#generation;
    this.#starting = true;
    /** @type {string | undefined} */
    let token;
    try {
      token = refused === undefined ? await this.#token.get() : await this.#token.refresh();
    } catch (error) {
      console.warn("ABP bridge: could not refresh the expired page token.", error);
    }
    if (generation !== this.#generation) return; // the parent left meanwhile
    this.#starting = false;
    if (refused !== undefined && token === undefined) {
      this.#settle(refused, refused.notice);
      return;
    }
    try {
      this.#open(token);
    } catch (error) {
      console.error("ABP bridge: could not open the app's WebSocket", error);
      this.#settle({ code: 1006, reason: String(error) });
    }
  }

  /** The app's WebSocket URL. */
  #endpoint() {
    const url = new URL(this.#config.endpoint, location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    return url.href;
  }

  /** The socket's messages go to the parent, its close here. @param {WebSocketTransport} socket */
  #listen(socket) {
    socket.onmessage = (/** @type {any} */ message) => {
      if (socket === this.#socket) {
        if (refusalNotice(message) !== null) {
          this.#refusal = message; // the close follows
          return;
        }
        this.#unheard = null; // the app read what came before: never replay it
      }
      this.#outbound = this.#outbound
        .then(() => this.#deliver(message))
        .catch((error) => console.error("ABP bridge: could not deliver a message", error));
    };
    socket.onclose = (info) => this.#closed(socket, info);
  }

  /** @param {string | undefined} token */
  #open(token) {
    const socket = new WebSocketTransport(this.#endpoint(), token);
    this.#listen(socket);
    const opened = socket.open(); // a URL the WebSocket refuses throws here, before it is taken
    this.#socket = socket;
    this.#unheard = [];
    this.#refusal = null;
    opened.then(() => {
      const queued = this.#queue;
      this.#queue = [];
      for (const text of queued) this.#send(socket, text);
    }, () => {}); // closed before it opened: onclose answers
  }

  /** A message from the server, to the parent. @param {Record<string, any>} message */
  async #deliver(message) {
    /** @type {Transferable[]} */
    let transfer = [];
    const id = readableId(message.id);
    if (message.type === MessageType.INITIALIZE_RESULT && isRecord(message.payload)) {
      this.#sessionId = typeof message.payload.sessionId === "string" ? message.payload.sessionId : null;
      this.#resumeToken = typeof message.payload.resumeToken === "string" ? message.payload.resumeToken : null;
    }
    const relayed = id === undefined ? undefined : this.#relayed.get(id);
    if (id !== undefined && relayed !== undefined && REPLY_TYPES[relayed.type] === message.type) {
      this.#relayed.delete(id);
      if (relayed.buffers && isRecord(message.payload) && isRecord(message.payload.data)) {
        const inline = decodeBinaryOutputs(message.payload.data);
        const referenced = await this.#fetchReferences(inline.data);
        message = { ...message, payload: { ...message.payload, data: referenced.data } };
        transfer = [...inline.buffers, ...referenced.buffers];
      }
    }
    this.#toParent(message, transfer);
  }

  /**
   * A caller that asked for ArrayBuffers gets them for large results too: the bridge
   * is same-origin with download URLs, so it fetches them (a failed fetch leaves the
   * reference as it is).
   * @param {Record<string, any>} data
   * @returns {Promise<{data: Record<string, any>, buffers: ArrayBuffer[]}>}
   */
  async #fetchReferences(data) {
    /** @type {Record<string, any>} */
    const out = { ...data };
    /** @type {ArrayBuffer[]} */
    const buffers = [];
    for (const [key, value] of Object.entries(data)) {
      if (!isRecord(value) || typeof value.downloadUrl !== "string") continue;
      try {
        const response = await fetch(value.downloadUrl, { credentials: "same-origin" });
        if (!response.ok) continue;
        const buffer = await response.arrayBuffer();
        const { downloadUrl, expiresAt, ...rest } = value;
        out[key] = { ...rest, content: buffer, encoding: "arraybuffer", size: buffer.byteLength };
        buffers.push(buffer);
      } catch {
        // Keep the reference.
      }
    }
    return { data: out, buffers };
  }

  /** @param {WebSocketTransport} socket @param {CloseInfo} info */
  #closed(socket, info) {
    if (socket !== this.#socket) return;
    this.#socket = null;
    if (
      this.#sessionId !== null &&
      this.#resumeToken !== null &&
      this.#refusal === null &&
      info.code !== undefined &&
      RESUMABLE_CLOSE_CODES.includes(info.code)
    ) {
      void this.#resume(info);
      return;
    }
    this.#sessionId = null;
    const unread = this.#unheard;
    this.#unheard = null;
    const retried = this.#retrying;
    this.#retrying = false;
    const notice = this.#refusal;
    this.#refusal = null;
    const refused = refusalError(info.code, info.reason, refusalNotice(notice));
    if (isExpiredRefusal(refused) && unread !== null && !retried) {
      // Refused before it read a frame: the same frames, once, on a socket with a fresh token.
      this.#retrying = true;
      this.#queue = [...unread, ...this.#queue];
      void this.#connect({ ...info, notice });
      return;
    }
    this.#settle(info, notice);
  }

  /**
   * The socket dropped: resume the session on a new one, trying until the app answers
   * or the grace period is over. Relayed calls and cancels keep waiting (a cancel is
   * sent again: its reply may have gone with the old socket); other requests had their
   * replies there, and are answered DISCONNECTED now.
   * @param {CloseInfo} dropped
   */
  async #resume(dropped) {
    const generation = this.#generation;
    this.#resuming = true;
    const lost = wireError(ErrorCode.DISCONNECTED, `The app's connection dropped (${dropped.code}) before the reply.`);
    for (const [id, relayed] of [...this.#relayed]) {
      if (relayed.type === MessageType.CALL || relayed.type === MessageType.CANCEL) continue;
      this.#relayed.delete(id);
      this.#toParent(errorReply(relayed.type, id, lost, relayed.callId));
    }
    /** @type {WebSocketTransport | null} */
    let resumedOn = null;
    const outcome = await keepResuming(
      async ({ expired }) => {
        let token;
        try {
          token = expired ? await this.#token.refresh() : await this.#token.get();
        } catch (error) {
          console.warn("ABP bridge: could not get a page token to resume with.", error);
        }
        const socket = new WebSocketTransport(this.#endpoint(), token);
        const tried = await this.#handshake(socket);
        if (generation !== this.#generation) socket.close("parent left");
        else if (tried.resumed) resumedOn = socket;
        return tried;
      },
      RESUME_GRACE_MS,
      () => generation !== this.#generation,
    );
    if (generation !== this.#generation) return;
    this.#resuming = false;
    if (resumedOn !== null) {
      this.#socket = resumedOn; // listened to since the handshake
      this.#unheard = null;
      const held = outcome.heldCalls === undefined ? null : new Set(outcome.heldCalls);
      const lost = held === null ? [] : this.#sentCalls().filter((relayed) => !held.has(String(relayed.callId)));
      const again = lost.map((relayed) => JSON.stringify(resentCall(JSON.parse(/** @type {string} */ (relayed.callFrame)))));
      const cancels = [...this.#relayed.values()].flatMap((relayed) => (relayed.frame ? [relayed.frame] : []));
      const queued = this.#queue;
      this.#queue = [];
      for (const text of [...again, ...cancels, ...queued]) this.#send(resumedOn, text);
      return;
    }
    const wire = outcome.error;
    const closeCode = wire?.details?.closeCode;
    /** @type {CloseInfo} */
    const ended =
      wire === undefined
        ? { code: dropped.code, reason: `The session could not be resumed: ${outcome.why}.` }
        : wire.code === ErrorCode.PERMISSION_DENIED && typeof closeCode === "number"
          ? { code: closeCode, reason: wire.details?.reason } // answered PERMISSION_DENIED
          : { code: dropped.code, reason: `${wire.code}: ${wire.message}` };
    this.#sessionId = null;
    this.#resumeToken = null;
    this.#settle(ended);
  }

  /**
   * Open `socket` and resume the session on it; the resume's initialize-result stays
   * here (the parent's session is the same one).
   * @param {WebSocketTransport} socket
   * @returns {Promise<{resumed?: true, error?: WireError, closed?: CloseInfo}>}
   */
  async #handshake(socket) {
    try {
      await socket.open();
    } catch (error) {
      return { closed: { code: 1006, reason: String(error) } };
    }
    const awaiting = this.#sentCalls().map((relayed) => String(relayed.callId));
    const session = { sessionId: this.#sessionId, token: this.#resumeToken, awaiting };
    return resumeOn(socket, this.#hello, session, (resumeToken) => {
      this.#resumeToken = resumeToken;
      this.#listen(socket);
    });
  }

  /** Relayed calls waiting for their answer that went out on a socket (not queued). */
  #sentCalls() {
    const queued = new Set(this.#queue);
    return [...this.#relayed.values()].filter(
      (relayed) => relayed.callFrame !== undefined && relayed.callId !== undefined && !queued.has(relayed.callFrame),
    );
  }

  /**
   * The socket is gone: answer every request still waiting (PERMISSION_DENIED when the
   * app refused the credential, else DISCONNECTED), then tell the parent.
   * @param {CloseInfo} info
   * @param {Record<string, any> | null} [notice] The app's refusal notice, passed on first.
   */
  #settle({ code, reason }, notice = null) {
    this.#queue = [];
    this.#retrying = false;
    const waiting = [...this.#relayed.entries()];
    this.#relayed.clear();
    const refused = refusalError(code, reason, refusalNotice(notice));
    this.#outbound = this.#outbound.then(() => {
      if (notice !== null) this.#toParent(notice);
      const error =
        refused ?? wireError(ErrorCode.DISCONNECTED, `The app's connection closed (${code}) before the reply.`);
      for (const [id, relayed] of waiting) this.#toParent(errorReply(relayed.type, id, error, relayed.callId));
      this.#toParent(envelope(BridgeMessageType.CLOSED, { code, reason: refused?.details?.reason ?? reason }));
    });
  }

  /**
   * The parent is leaving: cancel every call relayed for it and end the session, then
   * close. The server would cancel them on the disconnect anyway; saying so first
   * records why, and does not depend on how the socket ends.
   * @param {string} reason
   */
  #leave(reason) {
    const socket = this.#socket;
    if (socket === null) {
      if (this.#starting || this.#resuming) {
        // No socket to say goodbye on: drop what waits for one. A session being
        // resumed is ended by the app when its grace period passes.
        this.#generation += 1;
        this.#starting = false;
        this.#resuming = false;
        this.#settle({ code: 1000, reason });
      }
      return;
    }
    /** @type {string[]} */
    const frames = [];
    for (const relayed of this.#relayed.values()) {
      if (relayed.type === MessageType.CALL && relayed.callId !== undefined) {
        frames.push(JSON.stringify(envelope(MessageType.CANCEL, { callId: relayed.callId, reason })));
      }
    }
    frames.push(JSON.stringify(envelope(MessageType.SHUTDOWN, { reason })));
    if (socket.isOpen) {
      for (const text of frames) socket.sendText(text);
    }
    socket.close("parent left");
    // Answer the parent now (it may still be there, if only this iframe is going).
    this.#closed(socket, { code: 1000, reason });
  }
}

const configElement = document.getElementById("abp-embed-config");
if (configElement !== null) {
  new Bridge(JSON.parse(configElement.textContent ?? "{}")).start();
}
