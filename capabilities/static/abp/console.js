// @ts-check
/**
 * The console page (/abp/console/, capabilities/web/console.py): every capability the
 * signed-in user may call, each as a form drawn from its input schema
 * (console_form.js), run through `window.abp` as an agent's call would be.
 *
 * The list is the session's: initialize-result names what this page's principal (the
 * user its page token is bound to) may call; the schemas come from
 * `abp.listCapabilities()`. A run shows its progress (stage, percent), a Cancel button
 * (an AbortController: window.abp sends `capabilities/cancel`), and its result: the
 * data as JSON, a link for each file in it (an image shown too), or the error's code
 * and message. Nothing from a capability (descriptions, results) is parsed as HTML.
 * `#name` in the URL opens that capability's form.
 */

import { FieldError, formFor } from "./console_form.js";
import { base64ToBytes, isRecord, newId } from "./wire.js";

/** @typedef {import("./wire.js").ABPResponse} ABPResponse */
/** @typedef {import("./wire.js").ProgressInfo} ProgressInfo */
/** @typedef {{name: string, description: string, available: boolean, inputSchema: unknown}} Capability */

const AGENT = { name: "abp-jobs console", version: "1" };
const CANCEL_REASON = "Cancelled from the console.";
// How deep a result is searched for files.
const FILE_DEPTH = 6;

const $ = (/** @type {string} */ selector) => /** @type {HTMLElement} */ (document.querySelector(selector));
const abp = /** @type {any} */ (window).abp;
/** Runs waiting for their result, by callId. @type {Map<string, RunView>} */
const runs = new Map();

/**
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag @param {string} [className] @param {string} [text]
 * @returns {HTMLElementTagNameMap[K]}
 */
function make(tag, className, text) {
  const element = document.createElement(tag);
  if (className) element.className = className;
  if (text !== undefined) element.textContent = text;
  return element;
}

/** @param {string} state @param {string} text */
function setConnection(state, text) {
  const connection = $("#connection");
  connection.dataset.state = state;
  connection.textContent = text;
}

/**
 * A file in a result: inline BinaryData (`{content, encoding: "base64", mimeType}`) or a
 * download reference (`{downloadUrl, mimeType}`).
 * @param {unknown} value
 * @returns {value is {content?: string, encoding?: string, downloadUrl?: string, mimeType?: string, filename?: string, size?: number}}
 */
function isFile(value) {
  if (!isRecord(value)) return false;
  const inline = typeof value.content === "string" && value.encoding === "base64";
  return inline || typeof value.downloadUrl === "string";
}

/**
 * Every file in a result, with where it is (`document`, `pages.2.image`).
 * @param {unknown} data @param {string} [path] @param {number} [depth]
 * @returns {{path: string, file: Record<string, any>}[]}
 */
function filesIn(data, path = "", depth = 0) {
  if (isFile(data)) return [{ path, file: data }];
  if (depth >= FILE_DEPTH || (typeof data !== "object" || data === null)) return [];
  return Object.entries(data).flatMap(([key, value]) => filesIn(value, path ? `${path}.${key}` : key, depth + 1));
}

/** The result as pretty JSON, a file's base64 shortened to its size. @param {unknown} data */
function pretty(data) {
  return JSON.stringify(
    data,
    function (key, value) {
      if (key === "content" && typeof value === "string" && isFile(this)) {
        return `(${value.length} characters of base64: the file is linked below)`;
      }
      return value;
    },
    2,
  );
}

/**
 * Where a file can be had: a blob: URL for inline bytes, or its download URL if it is
 * http(s) (a result is host code's data: no javascript: URL becomes a link).
 * @param {Record<string, any>} file
 * @returns {string | null}
 */
function fileUrl(file) {
  if (typeof file.downloadUrl === "string") {
    const url = new URL(file.downloadUrl, location.href);
    return url.protocol === "https:" || url.protocol === "http:" ? url.href : null;
  }
  const type = typeof file.mimeType === "string" ? file.mimeType : "application/octet-stream";
  const bytes = /** @type {Uint8Array<ArrayBuffer>} */ (base64ToBytes(file.content));
  return URL.createObjectURL(new Blob([bytes], { type }));
}

/** One run: its card in the list, its progress, its Cancel button, its result. */
class RunView {
  /** @param {string} capability @param {string} callId @param {() => void} onCancel */
  constructor(capability, callId, onCancel) {
    this.element = make("li", "abp-run");
    this.element.dataset.callId = callId;
    this.element.dataset.capability = capability;
    this.status = make("span", "abp-run-status abp-badge");
    this.cancelButton = make("button", "abp-run-cancel", "Cancel");
    this.cancelButton.type = "button";
    this.cancelButton.addEventListener("click", () => {
      this.cancelButton.disabled = true;
      this.setStatus("cancelling");
      onCancel();
    });
    const head = make("div", "abp-run-head");
    head.append(make("strong", "abp-run-title", capability), " ", make("code", "abp-run-id", callId.slice(0, 8)), " ");
    head.append(this.status, " ", this.cancelButton);
    this.bar = make("progress", "abp-run-progress");
    this.bar.max = 100;
    this.bar.removeAttribute("value"); // indeterminate until a percentage comes
    this.stage = make("span", "abp-run-stage");
    const progress = make("div", "abp-run-bar");
    progress.append(this.bar, " ", this.stage);
    this.result = make("div", "abp-run-result");
    this.element.append(head, progress, this.result);
    this.setStatus("queued");
    $("#no-runs").hidden = true;
    $("#runs").prepend(this.element);
  }

  /** @param {string} status */
  setStatus(status) {
    this.element.dataset.status = status;
    this.status.textContent = status;
  }

  started() {
    if (this.element.dataset.status === "queued") this.setStatus("running");
  }

  /** @param {ProgressInfo} progress */
  progress(progress) {
    this.started();
    const { percentage, total, stage } = progress;
    if (typeof percentage === "number") {
      this.bar.value = percentage;
      this.element.dataset.percentage = percentage.toFixed(1);
    }
    const count = total ? `${progress.progress}/${total}` : String(progress.progress);
    const percent = typeof percentage === "number" ? ` (${percentage.toFixed(percentage < 10 ? 1 : 0)}%)` : "";
    this.stage.textContent = `${stage ?? ""} ${count}${percent}`.trim();
  }

  /** @param {ABPResponse} response */
  settle(response) {
    this.cancelButton.disabled = true;
    const seconds = ((response.metadata?.duration ?? 0) / 1000).toFixed(2);
    if (response.cancelled || !response.success) {
      this.setStatus(response.cancelled ? "cancelled" : "failed");
      if (this.bar.position < 0) this.bar.value = 0; // no longer indeterminate
      const error = response.error;
      const line = make("p", "abp-run-error");
      line.append(make("code", "abp-run-error-code", error?.code ?? "ERROR"), " ", error?.message ?? "");
      this.result.append(line);
      if (error?.details !== undefined) this.result.append(make("pre", "abp-run-json", pretty(error.details)));
      return;
    }
    this.setStatus("succeeded");
    this.bar.value = 100;
    this.result.append(make("p", "abp-run-facts", `Done in ${seconds} s.`));
    for (const { path, file } of filesIn(response.data)) this.result.append(fileView(path, file));
    this.result.append(make("pre", "abp-run-json", pretty(response.data ?? null)));
  }
}

/** A file's link, and the picture when it is an image. @param {string} path @param {Record<string, any>} file */
function fileView(path, file) {
  const box = make("div", "abp-run-file");
  const url = fileUrl(file);
  const name = typeof file.filename === "string" && file.filename ? file.filename : path || "result";
  const size = typeof file.size === "number" ? `, ${file.size} bytes` : "";
  const what = `${name} (${file.mimeType ?? "unknown type"}${size})`;
  if (url === null) {
    box.append(make("span", "", `${path}: ${what}`));
    return box;
  }
  const link = make("a", "abp-run-download", `Download ${what}`);
  link.href = url;
  link.download = name;
  box.append(link);
  if (typeof file.mimeType === "string" && file.mimeType.startsWith("image/")) {
    const picture = make("img", "abp-run-image");
    picture.src = url;
    picture.alt = name;
    box.append(picture);
  }
  return box;
}

/**
 * Call a capability and show the run.
 * @param {string} capability @param {Record<string, unknown>} params
 */
async function run(capability, params) {
  const controller = new AbortController();
  const callId = newId();
  const view = new RunView(capability, callId, () => controller.abort(CANCEL_REASON));
  runs.set(callId, view);
  try {
    /** @type {ABPResponse} */
    const response = await abp.call(capability, params, {
      callId,
      signal: controller.signal,
      onProgress: (/** @type {ProgressInfo} */ progress) => view.progress(progress),
    });
    view.settle(response);
  } finally {
    runs.delete(callId);
  }
}

/** A capability's entry in the list and its form. @param {Capability} capability */
function addCapability(capability) {
  const { name } = capability;
  const item = make("li");
  item.dataset.capability = name;
  const link = make("a", "", name);
  link.href = `#${encodeURIComponent(name)}`;
  const unavailable = make("span", "abp-badge abp-unavailable", "no worker");
  unavailable.title = "No live worker can run it now: a call is refused CAPABILITY_UNAVAILABLE.";
  unavailable.hidden = capability.available;
  item.append(link, " ", unavailable);
  $("#capability-list").append(item);

  const form = make("form", "abp-capability");
  form.dataset.capability = name;
  form.noValidate = true;
  form.hidden = true;
  form.append(make("h2", "", name));
  if (capability.description) form.append(make("p", "abp-description", capability.description));
  const fields = formFor(capability.inputSchema);
  const problem = make("p", "abp-form-error");
  problem.hidden = true;
  problem.setAttribute("role", "alert");
  const submit = make("button", "abp-run-button", "Run");
  submit.type = "submit";
  form.append(fields.element, problem, submit);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    problem.hidden = true;
    /** @type {Record<string, unknown>} */
    let params;
    try {
      params = /** @type {Record<string, unknown>} */ (fields.read());
    } catch (error) {
      if (!(error instanceof FieldError)) throw error;
      problem.textContent = `Not sent: ${error.message}`;
      problem.hidden = false;
      /** @type {HTMLElement | null} */ (form.querySelector("[aria-invalid]"))?.focus();
      return;
    }
    void run(name, params);
  });
  $("#capability-forms").append(form);
}

/** Show the form the URL's fragment names, else the first. */
function showSelected() {
  const wanted = decodeURIComponent(location.hash.slice(1));
  const forms = /** @type {HTMLFormElement[]} */ ([...document.querySelectorAll("form.abp-capability")]);
  const chosen = forms.find((form) => form.dataset.capability === wanted) ?? forms[0];
  for (const form of forms) form.hidden = form !== chosen;
  for (const item of document.querySelectorAll("#capability-list li")) {
    const current = /** @type {HTMLElement} */ (item).dataset.capability === chosen?.dataset.capability;
    item.querySelector("a")?.toggleAttribute("aria-current", current);
  }
}

/** Workers came or went: the list's marks follow. @param {{name: string, available?: boolean}[]} listed */
function showAvailability(listed) {
  for (const { name, available } of listed) {
    const item = [...document.querySelectorAll("#capability-list li")].find(
      (candidate) => /** @type {HTMLElement} */ (candidate).dataset.capability === name,
    );
    const mark = /** @type {HTMLElement | null | undefined} */ (item?.querySelector(".abp-unavailable"));
    if (mark) mark.hidden = available !== false;
  }
}

async function main() {
  if (!abp) {
    setConnection("failed", "window.abp is missing: the page lacks {% abp_runtime %}.");
    return;
  }
  abp.onNotification((/** @type {any} */ notification) => {
    const data = isRecord(notification?.data) ? notification.data : {};
    if (notification?.event === "notifications/operation/started") runs.get(String(data.operationId))?.started();
    if (notification?.event === "notifications/capabilities/changed" && Array.isArray(data.capabilities)) {
      showAvailability(data.capabilities);
    }
  });
  let session;
  try {
    session = await abp.initialize({ agent: AGENT, features: { notifications: true, progress: true } });
  } catch (error) {
    const code = isRecord(error) && typeof error.code === "string" ? `${error.code}: ` : "";
    setConnection("failed", `The app refused the session: ${code}${error instanceof Error ? error.message : error}`);
    return;
  }
  // The session lists what this user may call; the manifest has the schemas.
  /** @type {{name: string, available?: boolean}[]} */
  const offered = Array.isArray(session.capabilities) ? session.capabilities : [];
  /** @type {Map<string, Capability>} */
  const described = new Map();
  try {
    for (const capability of await abp.listCapabilities()) described.set(capability.name, capability);
  } catch (error) {
    console.warn("ABP console: no manifest; every form is a JSON textarea.", error);
  }
  for (const { name, available } of offered) {
    const known = described.get(name);
    addCapability({
      name,
      description: known?.description ?? "",
      available: available !== false,
      inputSchema: known?.inputSchema ?? { type: "object" },
    });
  }
  const count = offered.length;
  const listed = count === 1 ? "1 capability" : `${count} capabilities`;
  setConnection("ready", `Connected: session ${String(session.sessionId).slice(0, 8)}, ${listed} you may call.`);
  if (count === 0) $("#capability-forms").append(make("p", "abp-empty", "There is no capability you may call."));
  showSelected();
  window.addEventListener("hashchange", showSelected);
}

void main();
