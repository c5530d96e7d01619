// @ts-check
/**
 * The ABP runtime: defines `window.abp` for agents that drive this page with
 * Puppeteer or Playwright (the spec's reference client).
 *
 * Loaded synchronously, first in <head>, so `window.abp` exists before any other
 * script runs. It is small on purpose: the session is spoken by client.js over the
 * app's WebSocket (same host, ws: or wss: by the page's scheme), imported with
 * page_token.js when the agent calls initialize(). Configuration comes from this
 * script tag's data-* attributes: data-endpoint (the WebSocket path), data-manifest,
 * data-app-id, data-app-name, data-app-version, and the page's credential: data-token
 * (a signed page token, good for this page's origin), data-token-max-age (its
 * lifetime in seconds) and data-token-url (where a fresh one comes from).
 *
 * The socket is opened with the page token as its subprotocol. A token older than
 * half its max age (counted from this script's load) is replaced by a fresh one
 * first, so a page left open for hours still connects; a connection refused as
 * `expired-credentials` before initialize was answered is tried once more with a
 * fresh token. Any other refusal rejects initialize() with PERMISSION_DENIED.
 *
 *   await abp.initialize({agent: {name, version}, protocolVersion: "0.1",
 *                         features: {notifications: true, progress: true}});
 *   const result = await abp.call("export.pdf", {html}, {callId: "c1"});
 *   await abp.cancel("c1", "no longer needed");  // or abp.cancel({callId, reason})
 *
 * Progress and notifications go to window.__abp_progress / window.__abp_notification
 * when the agent exposed them (exposeFunction), and to abp.onProgress(fn) /
 * abp.onNotification(fn). A socket that drops (the network, a restarted server) is
 * replaced and the session resumed, calls in flight included (client.js); a page that
 * goes away (pagehide) shuts its session down. Every promise settles: a call always
 * resolves with an ABPResponse (DISCONNECTED, retryable, when the session could not be
 * resumed within the grace period or the socket closed for another reason; a
 * connection the app refused or cut off for its credential, PERMISSION_DENIED). The
 * runtime opens no dialog, window or download.
 */
(function () {
  "use strict";
  if ("abp" in window) return; // loaded twice: the first one stays

  const PROTOCOL_VERSION = "0.1";
  // The page, and with it its token, came no later than this.
  const loadedAt = Date.now();
  const script = /** @type {HTMLScriptElement | null} */ (document.currentScript);
  const data = script ? script.dataset : {};
  const clientUrl = new URL("client.js", script ? script.src : location.href).href;
  const pageTokenUrl = new URL("page_token.js", script ? script.src : location.href).href;
  const manifestUrl = new URL(data.manifest || "/abp.json", location.href).href;

  function endpoint() {
    const url = new URL(data.endpoint || "/abp/ws", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    return url.href;
  }

  // The codes the runtime answers with itself, before it has imported client.js (and
  // with it wire.js's ErrorCode): a classic script has no static imports. Neither is
  // retryable; tests/protocol/test_error_codes_pinned.py holds both facts to the server's codes.
  const ErrorCode = Object.freeze({
    NOT_INITIALIZED: "NOT_INITIALIZED",
    ALREADY_INITIALIZED: "ALREADY_INITIALIZED",
  });

  /** @param {string} code @param {string} message */
  function error(code, message) {
    return { code, message, retryable: false };
  }

  /** @param {string | undefined} callId @param {{code: string, message: string, retryable: boolean}} err */
  function failed(callId, err) {
    const response = { success: false, error: err, metadata: { duration: 0 } };
    return callId ? { callId, ...response } : response;
  }

  /** @type {any} client.js, once imported. */
  let clientModule = null;
  /** @type {any} The page's PageToken (page_token.js). */
  let pageToken = null;
  /** @type {any} The ABPClient of the open session. */
  let client = null;
  /** @type {Promise<any> | null} */
  let opening = null;
  /** @type {any} */
  let session = null;
  let wantsProgress = false;
  let app = { id: data.appId || "", name: data.appName || "", version: data.appVersion || "" };
  /** @type {Promise<any> | null} */
  let manifest = null;
  const progressHandlers = new Set();
  const notificationHandlers = new Set();

  /**
   * Hand an event to the agent's exposed function and to the page's handlers; none of
   * them can break the others or the session.
   * @param {string} exposedName @param {Set<Function>} handlers @param {unknown} payload
   */
  function dispatch(exposedName, handlers, payload) {
    const exposed = /** @type {any} */ (window)[exposedName];
    if (typeof exposed === "function") {
      try {
        const result = exposed(payload);
        if (result && typeof result.catch === "function") result.catch(() => {});
      } catch (err) {
        console.error(`ABP runtime: ${exposedName} threw`, err);
      }
    }
    for (const handler of [...handlers]) {
      try {
        handler(payload);
      } catch (err) {
        console.error("ABP runtime: a handler threw", err);
      }
    }
  }

  function loadManifest() {
    if (manifest === null) {
      manifest = fetch(manifestUrl, { headers: { Accept: "application/json" } })
        .then((response) => {
          if (!response.ok) throw new Error(`${manifestUrl}: HTTP ${response.status}`);
          return response.json();
        })
        .catch((err) => {
          manifest = null; // try again next time
          throw err;
        });
    }
    return manifest;
  }

  /**
   * The manifest's capabilities. Availability (a live worker can run it) comes from the
   * session when there is one, kept current by notifications/capabilities/changed;
   * otherwise from the manifest as loaded.
   */
  async function capabilities() {
    const document_ = await loadManifest();
    /** @type {Map<string, boolean>} */
    const available = new Map();
    for (const item of (session && session.capabilities) || []) available.set(item.name, item.available !== false);
    return (document_.capabilities || []).map((/** @type {any} */ spec) => ({
      name: spec.name,
      description: spec.description || "",
      available: available.size === 0 ? spec.available !== false : available.get(spec.name) === true,
      inputSchema: spec.inputSchema || { type: "object" },
      outputSchema: spec.outputSchema || { type: "object" },
    }));
  }

  function forget() {
    client = null;
    session = null;
  }

  /**
   * Connect with the page token and initialize; once more with a fresh token if the
   * app found the token expired (a page restored from a cache, a sleeping laptop).
   * @param {any} params
   */
  async function open(params) {
    if (clientModule === null) {
      const [imported, { PageToken }] = await Promise.all([import(clientUrl), import(pageTokenUrl)]);
      pageToken = new PageToken({
        token: data.token,
        url: data.tokenUrl,
        maxAgeSeconds: data.tokenMaxAge,
        issuedAt: loadedAt,
      });
      clientModule = imported;
    }
    // Each socket (a resumed session's too) gets the token in hand while it is young,
    // else a fresh one; a fresh one at once when the app found the last one expired.
    const token = (/** @type {{expired: boolean}} */ asked) => (asked.expired ? pageToken.refresh() : pageToken.get());
    for (let retried = false; ; retried = true) {
      /** @type {any} */
      let connected = null;
      try {
        connected = await clientModule.connect({ url: endpoint(), token });
        watch(connected);
        const result = await connected.initialize({ protocolVersion: PROTOCOL_VERSION, ...params });
        return { connected, result };
      } catch (err) {
        if (connected !== null) connected.close();
        if (retried || !clientModule.isExpiredRefusal(err) || !data.tokenUrl) throw err;
        try {
          await pageToken.refresh();
        } catch (refreshError) {
          console.warn("ABP runtime: could not refresh the expired page token.", refreshError);
          throw err;
        }
      }
    }
  }

  /** Route a connection's progress and notifications to the agent. @param {any} connected */
  function watch(connected) {
    connected.onProgress((/** @type {unknown} */ payload) => dispatch("__abp_progress", progressHandlers, payload));
    connected.onNotification((/** @type {any} */ payload) => {
      if (payload && payload.event === "notifications/capabilities/changed" && session !== null) {
        session = { ...session, capabilities: payload.data.capabilities };
      }
      dispatch("__abp_notification", notificationHandlers, payload);
    });
    connected.onClose(() => {
      if (client === connected) forget();
    });
  }

  const abp = {
    protocolVersion: PROTOCOL_VERSION,
    get app() {
      return app;
    },
    get initialized() {
      return client !== null;
    },
    get sessionId() {
      return session ? session.sessionId : null;
    },

    /**
     * Open the session. Rejects (an Error with `code`) if one is open already or the
     * app refuses: PERMISSION_DENIED when it refused the page's credential.
     * @param {any} [params]
     */
    async initialize(params = {}) {
      if (client !== null || opening !== null) {
        throw Object.assign(new Error("A session is open already; shut it down first."), {
          code: ErrorCode.ALREADY_INITIALIZED,
          retryable: false,
        });
      }
      opening = (async () => {
        const { connected, result } = await open(params);
        client = connected;
        session = result;
        wantsProgress = Boolean(result.features && result.features.progress);
        if (result.app) app = result.app;
        return result;
      })();
      try {
        return await opening;
      } finally {
        opening = null;
      }
    },

    /**
     * End the session: the app cancels and answers every call in flight first.
     * @param {{reason?: string}} [params]
     */
    async shutdown(params = {}) {
      const closing = client;
      if (closing === null) return;
      await closing.shutdown(params);
      if (client === closing) forget();
    },

    /**
     * Call a capability; always resolves with an ABPResponse. Options: callId,
     * timeout (ms), progressToken, onProgress, signal (an AbortSignal), binary. When
     * the session asked for progress, a call without a progressToken gets its callId
     * as one, so exposed __abp_progress hears about every call.
     * @param {string} capability @param {any} [params] @param {any} [options]
     */
    async call(capability, params = {}, options = {}) {
      const opts = { ...options };
      if (client === null) return failed(opts.callId, error(ErrorCode.NOT_INITIALIZED, "Call abp.initialize() first."));
      if (!opts.callId) opts.callId = clientModule.newId();
      if (opts.progressToken === undefined && wantsProgress) opts.progressToken = opts.callId;
      return client.call(capability, params, opts);
    },

    /**
     * Cancel a call: cancel(callId, reason) or cancel({callId, reason}). Resolves with
     * {callId, cancelled, reason?}; the call resolves with its own cancelled result.
     * @param {string | {callId: string, reason?: string}} callId @param {string} [reason]
     */
    async cancel(callId, reason) {
      if (typeof callId === "object" && callId !== null) ({ callId, reason } = callId);
      if (client === null) {
        return { callId, cancelled: false, error: error(ErrorCode.NOT_INITIALIZED, "Call abp.initialize() first.") };
      }
      return client.cancel(callId, reason);
    },

    /** Every capability: a plain array of {name, description, available, inputSchema}. */
    async listCapabilities() {
      return (await capabilities()).map(({ name, description, available, inputSchema }) => ({
        name,
        description,
        available,
        inputSchema,
      }));
    },

    /** One capability with its input and output schemas, or null. @param {string} name */
    async describeCapability(name) {
      return (await capabilities()).find((item) => item.name === name) || null;
    },

    /** Whether the app has this capability and it can be called now. @param {string} name */
    async supports(name) {
      const found = (await capabilities()).find((item) => item.name === name);
      return Boolean(found && found.available);
    },

    /** Hear every progress message. Returns a function that stops it. @param {Function} handler */
    onProgress(handler) {
      progressHandlers.add(handler);
      return () => progressHandlers.delete(handler);
    },

    /** Hear every notification. Returns a function that stops it. @param {Function} handler */
    onNotification(handler) {
      notificationHandlers.add(handler);
      return () => notificationHandlers.delete(handler);
    },
  };

  // A page that goes away ends its session now: its calls stop at once instead of
  // waiting out the grace period a dropped session is kept for.
  window.addEventListener("pagehide", () => {
    if (client !== null) void client.shutdown({ reason: "The page went away." });
  });

  Object.defineProperty(window, "abp", { value: Object.freeze(abp), enumerable: true });
})();
