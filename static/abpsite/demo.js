// @ts-check
/**
 * The demo page: runs jobs through the embedded bridge with client.js, as a site that
 * embeds the app would. Each job has a progress bar and a Cancel button (an
 * AbortController); results are shown in the page (a PDF in an iframe from a blob
 * URL, an image as <img>), never downloaded.
 */

import { connect, newId } from "../abp/client.js";

/** @typedef {import("../abp/wire.js").ABPResponse} ABPResponse */
/** @typedef {import("../abp/wire.js").ProgressInfo} ProgressInfo */

const LOG_LIMIT = 200;
const SUMMARY_LIMIT = 220;

const $ = (/** @type {string} */ selector) => /** @type {HTMLElement} */ (document.querySelector(selector));
const connection = $("#connection");
const frame = /** @type {HTMLIFrameElement} */ ($("#bridge"));
const log = $("#log");
/** @type {Map<string, JobView>} */
const jobs = new Map();

/** @param {string} state @param {string} text */
function setConnection(state, text) {
  connection.dataset.state = state;
  connection.textContent = text;
}

/** A short, readable form of a payload: binary content shown by its size. @param {unknown} payload */
function summarize(payload) {
  const text = JSON.stringify(payload, (key, value) => {
    if (value instanceof ArrayBuffer) return `<ArrayBuffer ${value.byteLength} bytes>`;
    if (ArrayBuffer.isView(value)) return `<${value.constructor.name} ${value.byteLength} bytes>`;
    if (key === "content" && typeof value === "string" && value.length > 48) return `<base64 ${value.length} chars>`;
    if (key === "html" && typeof value === "string" && value.length > 48) return `${value.slice(0, 40)}…`;
    return value;
  });
  return text.length > SUMMARY_LIMIT ? `${text.slice(0, SUMMARY_LIMIT)}…` : text;
}

/** @param {"in" | "out"} direction @param {Record<string, any>} message */
function logEnvelope(direction, message) {
  const item = document.createElement("li");
  item.className = direction;
  const arrow = document.createElement("span");
  arrow.className = "dir";
  arrow.textContent = direction === "out" ? "→" : "←";
  const type = document.createElement("code");
  type.className = "type";
  type.textContent = message.type;
  const body = document.createElement("span");
  body.className = "summary";
  body.textContent = summarize(message.payload);
  item.append(arrow, " ", type, " ", body);
  log.prepend(item);
  while (log.childElementCount > LOG_LIMIT) log.lastElementChild?.remove();
}

class JobView {
  /**
   * @param {string} title @param {string} callId @param {() => void} onCancel
   * @param {number | null} expectedPages export.pdf reports pages without a total while
   *   it lays them out; the page count the demo asked for stands in for it.
   */
  constructor(title, callId, onCancel, expectedPages) {
    this.expectedPages = expectedPages;
    const template = /** @type {HTMLTemplateElement} */ ($("#job-template"));
    this.element = /** @type {HTMLElement} */ (
      /** @type {DocumentFragment} */ (template.content.cloneNode(true)).firstElementChild
    );
    this.element.dataset.callId = callId;
    this.part(".job-title").textContent = title;
    this.part(".job-id").textContent = callId.slice(0, 8);
    this.bar = /** @type {HTMLProgressElement} */ (this.part(".job-progress"));
    this.cancelButton = /** @type {HTMLButtonElement} */ (this.part(".job-cancel"));
    this.cancelButton.addEventListener("click", () => {
      this.cancelButton.disabled = true;
      this.setStatus("cancelling");
      onCancel();
    });
    $("#no-jobs").hidden = true;
    $("#jobs").prepend(this.element);
  }

  /** @param {string} selector */
  part(selector) {
    return /** @type {HTMLElement} */ (this.element.querySelector(selector));
  }

  /** @param {string} status */
  setStatus(status) {
    this.element.dataset.status = status;
    this.part(".job-status").textContent = status;
  }

  started() {
    if (this.element.dataset.status === "queued") this.setStatus("running");
  }

  /** @param {ProgressInfo} progress */
  progress(progress) {
    this.started();
    let percentage = progress.percentage;
    if ((percentage === null || percentage === undefined) && this.expectedPages && progress.stage === "layout") {
      percentage = Math.min(99, (100 * progress.progress) / this.expectedPages);
    }
    if (percentage !== null && percentage !== undefined) {
      this.bar.value = percentage;
      this.element.dataset.percentage = percentage.toFixed(1);
    }
    const total = progress.total ? `/${progress.total}` : "";
    this.part(".job-stage").textContent = `${progress.stage} ${progress.progress}${total}`;
  }

  /** @param {ABPResponse} result */
  settle(result) {
    this.cancelButton.disabled = true;
    const output = this.part(".job-result");
    const seconds = ((result.metadata?.duration ?? 0) / 1000).toFixed(2);
    if (result.cancelled) {
      this.setStatus("cancelled");
      output.textContent = `Cancelled (${result.error?.code}): ${result.error?.message ?? ""}`;
      return;
    }
    if (!result.success) {
      this.setStatus("failed");
      output.textContent = `${result.error?.code}: ${result.error?.message ?? ""}`;
      return;
    }
    this.setStatus("succeeded");
    this.bar.value = 100;
    const data = result.data ?? {};
    const binary = data.document ?? data.image;
    if (binary && binary.content instanceof ArrayBuffer) {
      const url = URL.createObjectURL(new Blob([binary.content], { type: binary.mimeType }));
      const view = data.document ? document.createElement("iframe") : document.createElement("img");
      view.className = data.document ? "pdf" : "picture";
      // The PDF viewer's open parameters: fit the width, no thumbnails.
      view.src = data.document ? `${url}#view=FitH&navpanes=0` : url;
      if (view instanceof HTMLImageElement) view.alt = binary.filename ?? "result";
      else view.title = binary.filename ?? "PDF";
      const facts = document.createElement("p");
      facts.className = "facts";
      const pages = data.pageCount ? `${data.pageCount} pages, ` : "";
      const size = data.width ? `${data.width}×${data.height}, ` : "";
      facts.textContent = `${binary.filename ?? ""}: ${pages}${size}${binary.content.byteLength} bytes in ${seconds} s`;
      output.append(facts, view);
    } else {
      output.textContent = JSON.stringify(data);
    }
  }
}

/**
 * Run one job: a call with its own AbortController, progress and result in its view.
 * @param {import("../abp/client.js").ABPClient} client
 * @param {string} title @param {string} capability @param {Record<string, any>} params
 * @param {number | null} [expectedPages]
 */
async function runJob(client, title, capability, params, expectedPages = null) {
  const controller = new AbortController();
  const callId = newId();
  const view = new JobView(title, callId, () => controller.abort("Cancelled from the demo page."), expectedPages);
  jobs.set(callId, view);
  try {
    const result = await client.call(capability, params, {
      callId,
      signal: controller.signal,
      binary: "arraybuffer",
      onProgress: (progress) => view.progress(progress),
    });
    view.settle(result);
  } finally {
    jobs.delete(callId);
  }
}

/** @param {string} fragment @param {number} pages */
function documentOf(fragment, pages) {
  const body = Array.from({ length: pages }, (_, i) => `<section><p class="n">Page ${i + 1}</p>${fragment}</section>`);
  return `<!doctype html><html><head><meta charset="utf-8"><style>
    body { font-family: sans-serif; } section { page-break-after: always; }
    table { border-collapse: collapse; } td, th { border: 1px solid #999; padding: 4px 10px; }
    .n { color: #777; font-size: 10pt; }</style></head><body>${body.join("")}</body></html>`;
}

/** @param {string} operation */
function operationOf(operation) {
  switch (operation) {
    case "blur":
      return { type: "blur", radius: 4 };
    case "sharpen":
      return { type: "sharpen", radius: 2, percent: 150, threshold: 3 };
    case "thumbnail":
      return { type: "thumbnail", width: 320, height: 320 };
    case "rotate":
      return { type: "rotate", degrees: 90, expand: true };
    case "flip":
      return { type: "flip", direction: "horizontal" };
    default:
      return { type: "grayscale" };
  }
}

async function main() {
  const origin = new URL(frame.src, location.href).origin;
  let client;
  try {
    client = await connect({ window: /** @type {Window} */ (frame.contentWindow), origin });
  } catch (error) {
    setConnection("failed", `The bridge did not answer: ${error}`);
    return;
  }
  client.onEnvelope(logEnvelope);
  client.onNotification((notification) => {
    if (notification.event === "notifications/operation/started") {
      jobs.get(notification.data?.operationId)?.started();
    }
  });
  client.onClose(() => setConnection("closed", "The session ended; reload the page to start another."));
  try {
    const session = await client.initialize({
      agent: { name: "demo page", version: "1" },
      features: { notifications: true, progress: true },
    });
    setConnection("ready", `Connected: session ${session.sessionId.slice(0, 8)}, through ${origin}/abp/embed/`);
  } catch (error) {
    setConnection("failed", `The app refused the session: ${error}`);
    return;
  }

  const pdfForm = /** @type {HTMLFormElement} */ ($("#pdf-form"));
  pdfForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const form = new FormData(pdfForm);
    const pages = Math.max(1, Math.min(500, Number(form.get("pages")) || 1));
    const params = {
      html: documentOf(String(form.get("html")), pages),
      options: {
        pageSize: String(form.get("pageSize")),
        landscape: form.get("landscape") === "on",
        headerText: "ABP Jobs demo",
        filename: "report.pdf",
      },
    };
    const title = `export.pdf, ${pages} page${pages === 1 ? "" : "s"}`;
    void runJob(/** @type {any} */ (client), title, "export.pdf", params, pages);
  });

  const imageForm = /** @type {HTMLFormElement} */ ($("#image-form"));
  imageForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = new FormData(imageForm);
    const file = /** @type {File} */ (form.get("image"));
    if (!(file instanceof File) || file.size === 0) return;
    const operation = String(form.get("operation"));
    const params = {
      // An ArrayBuffer: the bridge turns it into base64 before relaying it.
      image: { content: await file.arrayBuffer(), mimeType: file.type || "application/octet-stream" },
      operations: [operationOf(operation)],
      format: String(form.get("format")),
    };
    void runJob(/** @type {any} */ (client), `process.image, ${operation}`, "process.image", params);
  });
}

void main();
