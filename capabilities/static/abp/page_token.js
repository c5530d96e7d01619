// @ts-check
/**
 * The credential of the app's own pages (`window.abp`, the embed bridge): the signed
 * page token the server renders into the page, and fresh ones from its token URL once
 * it is old. No build step; runtime.js and bridge.js import it.
 * @module abp/page_token
 */

import { ABPError, ErrorCode, isRecord, wireError } from "./wire.js";

/** How long a page token lasts when the page does not say (the app's default). */
export const PAGE_TOKEN_MAX_AGE_S = 600;

/**
 * The signed page token the server rendered into the page, good for connections from
 * the page's origin for `maxAgeSeconds`. A page can stay open longer than that, so
 * `get()` gives the rendered token while it is younger than half its max age, and after
 * that a fresh one from the app's token URL (a same-origin fetch, never cached).
 */
export class PageToken {
  /** @type {string | undefined} */
  #token;
  /** @type {string | undefined} */
  #url;
  #maxAgeMs = PAGE_TOKEN_MAX_AGE_S * 1000;
  /** About when the token was signed (Unix ms). */
  #issuedAt;
  /** @type {Promise<string> | null} */
  #refreshing = null;

  /**
   * @param {object} options
   * @param {string} [options.token] The token rendered into the page.
   * @param {string} [options.url] Where a fresh one comes from (GET, same origin).
   * @param {number | string} [options.maxAgeSeconds] How long a token lasts.
   * @param {number} [options.issuedAt] Unix ms when the page got its token; the load
   *   time of the script that read it will do (the page came a little earlier).
   */
  constructor({ token, url, maxAgeSeconds, issuedAt = Date.now() }) {
    this.#token = token || undefined;
    this.#url = url || undefined;
    this.#issuedAt = issuedAt;
    this.#setMaxAge(maxAgeSeconds);
  }

  /** @param {unknown} seconds */
  #setMaxAge(seconds) {
    const value = Number(seconds);
    if (seconds !== undefined && seconds !== "" && Number.isFinite(value) && value > 0) this.#maxAgeMs = value * 1000;
  }

  /**
   * The token to connect with now: the one in hand while it is younger than half its
   * max age, else a fresh one. When none can be had, the one in hand (the app says
   * whether it still lets it in); undefined when the page has none at all (an app
   * that allows anonymous access renders none).
   * @returns {Promise<string | undefined>}
   */
  async get() {
    if (this.#token !== undefined && Date.now() - this.#issuedAt < this.#maxAgeMs / 2) return this.#token;
    if (this.#url === undefined) return this.#token;
    try {
      return await this.refresh();
    } catch (error) {
      console.warn("ABP: could not refresh the page token; trying the one the page has.", error);
      return this.#token;
    }
  }

  /**
   * A fresh token from the token URL (one request at a time).
   * @returns {Promise<string>} Rejects (ABPError, TRANSPORT_ERROR) when there is none.
   */
  refresh() {
    if (this.#refreshing === null) {
      this.#refreshing = this.#fetch().finally(() => {
        this.#refreshing = null;
      });
    }
    return this.#refreshing;
  }

  async #fetch() {
    const url = this.#url;
    if (url === undefined) {
      throw new ABPError(wireError(ErrorCode.TRANSPORT_ERROR, "This page names no URL for fresh page tokens."));
    }
    const asked = Date.now();
    /** @type {unknown} */
    let body;
    try {
      const response = await fetch(url, {
        cache: "no-store",
        credentials: "same-origin",
        mode: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      body = await response.json();
    } catch (error) {
      throw new ABPError(wireError(ErrorCode.TRANSPORT_ERROR, `Could not get a page token from ${url}: ${error}`));
    }
    if (!isRecord(body) || typeof body.token !== "string" || body.token === "") {
      throw new ABPError(wireError(ErrorCode.TRANSPORT_ERROR, `${url} answered without a token.`));
    }
    this.#token = body.token;
    this.#issuedAt = asked; // signed after we asked: its age counts from then, to be safe
    this.#setMaxAge(body.maxAgeSeconds);
    return body.token;
  }
}
