// @ts-check
/**
 * "Your jobs" (/abp/jobs/): renders the signed-in user's jobs from the JSON API, asks
 * again every second while one of them is active (every ten seconds otherwise, so new
 * ones appear), and cancels one with a POST carrying the page's CSRF token. No
 * framework, no build step; every value goes into the page as text, never as HTML.
 * @module abp/your_jobs
 */

/**
 * @typedef {object} FileLink
 * @property {string} name
 * @property {string} filename
 * @property {string} mimeType
 * @property {number} size
 * @property {string | null} downloadUrl
 * @property {boolean} gone
 *
 * @typedef {object} Job
 * @property {string} id
 * @property {string} capability
 * @property {string} door
 * @property {string} client
 * @property {string} status
 * @property {boolean} active
 * @property {number | null} progress
 * @property {number | null} progressTotal
 * @property {string} stage
 * @property {string} createdAt
 * @property {string | null} settledAt
 * @property {{files: FileLink[], summary: string} | null} result
 * @property {{code: string, message: string} | null} error
 * @property {string | null} cancelSource
 * @property {string} cancelUrl
 *
 * @typedef {{jobs: Job[], nextCursor: string | null}} JobsPage
 */

const config = JSON.parse(document.getElementById("abp-your-jobs-config")?.textContent || "{}");
const body = /** @type {HTMLTableSectionElement} */ (document.querySelector("#abp-jobs tbody"));
const problem = /** @type {HTMLElement} */ (document.getElementById("abp-jobs-problem"));
const empty = /** @type {HTMLElement} */ (document.getElementById("abp-jobs-empty"));
const older = /** @type {HTMLAnchorElement} */ (document.getElementById("abp-jobs-older"));
const csrfInput = /** @type {HTMLInputElement | null} */ (document.querySelector("#abp-jobs-csrf [name=csrfmiddlewaretoken]"));

/** @type {ReturnType<typeof setTimeout> | undefined} */
let timer;
let anyActive = false;

/**
 * An element with text and attributes.
 * @param {string} tag @param {string} [text] @param {Record<string, string>} [attributes]
 */
function element(tag, text = "", attributes = {}) {
  const made = document.createElement(tag);
  if (text) made.textContent = text;
  for (const [name, value] of Object.entries(attributes)) made.setAttribute(name, value);
  return made;
}

/** @param {string | null} iso */
function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

/** @param {number} bytes */
function size(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

/** @param {Job} job */
function statusCell(job) {
  const cell = element("td", job.status, { class: "status" });
  if (job.cancelSource) cell.append(element("span", ` (by ${job.cancelSource})`, { class: "muted" }));
  return cell;
}

/** @param {Job} job */
function progressCell(job) {
  const cell = element("td");
  if (job.progress !== null && job.progressTotal) {
    cell.append(element("progress", "", { value: String(job.progress), max: String(job.progressTotal) }));
  }
  if (job.stage) cell.append(element("div", job.stage, { class: "muted" }));
  return cell;
}

/** @param {Job} job */
function resultCell(job) {
  const cell = element("td", "", { class: "result" });
  for (const file of job.result?.files ?? []) {
    const line = element("div");
    if (file.downloadUrl && !file.gone) {
      line.append(element("a", file.filename, { href: file.downloadUrl, download: file.filename }));
    } else {
      line.append(element("span", `${file.filename} (no longer kept)`, { class: "muted" }));
    }
    line.append(` ${file.mimeType}, ${size(file.size)}`);
    cell.append(line);
  }
  if (job.result?.summary) cell.append(element("code", job.result.summary));
  if (job.error) {
    cell.append(element("code", job.error.code), ` ${job.error.message}`);
  }
  return cell;
}

/** @param {Job} job */
function actionCell(job) {
  const cell = element("td");
  if (!job.active) return cell;
  const button = element("button", "Cancel", { type: "button", class: "abp-cancel", "data-url": job.cancelUrl });
  button.addEventListener("click", () => cancel(/** @type {HTMLButtonElement} */ (button)), { once: true });
  cell.append(button);
  return cell;
}

/** @param {Job} job */
function row(job) {
  const line = element("tr", "", { "data-job-id": job.id, "data-status": job.status });
  line.append(
    element("td", when(job.createdAt)),
    element("td", job.capability),
    element("td", job.door),
    element("td", job.client),
    statusCell(job),
    progressCell(job),
    element("td", when(job.settledAt)),
    resultCell(job),
    actionCell(job),
  );
  return line;
}

/** @param {JobsPage} page */
function render(page) {
  body.replaceChildren(...page.jobs.map(row));
  empty.hidden = page.jobs.length > 0;
  anyActive = page.jobs.some((job) => job.active);
  if (page.nextCursor) {
    const query = new URLSearchParams({ status: config.status || "", cursor: page.nextCursor });
    older.href = `?${query}`;
    older.hidden = false;
  } else {
    older.hidden = true;
  }
}

/** @param {string} text */
function showProblem(text) {
  problem.textContent = text;
  problem.hidden = !text;
}

/** What the API said went wrong. @param {Response} response */
async function errorOf(response) {
  try {
    const answer = await response.json();
    return `${answer.error.message} (${answer.error.code})`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

function listUrl() {
  const query = new URLSearchParams();
  if (config.status) query.set("status", config.status);
  if (config.cursor) query.set("cursor", config.cursor);
  const text = query.toString();
  return text ? `${config.listUrl}?${text}` : config.listUrl;
}

/** Ask for the list again now, then again after the poll interval. */
async function refresh() {
  clearTimeout(timer);
  try {
    const response = await fetch(listUrl(), { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } });
    if (response.ok) {
      render(await response.json());
      showProblem("");
    } else {
      showProblem(await errorOf(response));
    }
  } catch (error) {
    showProblem(`Could not reach the app: ${error}`);
  } finally {
    timer = setTimeout(poll, anyActive ? config.pollActiveMs : config.pollIdleMs);
  }
}

function poll() {
  // A hidden tab asks nothing; it refreshes when it is shown again.
  if (!document.hidden) void refresh();
}

/** @param {HTMLButtonElement} button */
async function cancel(button) {
  button.disabled = true;
  button.textContent = "Cancelling…";
  let failed = "";
  try {
    const response = await fetch(button.dataset.url || "", {
      method: "POST",
      credentials: "same-origin",
      headers: { Accept: "application/json", "X-CSRFToken": csrfInput?.value ?? "" },
    });
    if (!response.ok) failed = await errorOf(response);
  } catch (error) {
    failed = `Could not reach the app: ${error}`;
  }
  await refresh();
  // After the refresh, which clears what it had to say itself.
  if (failed) showProblem(failed);
}

document.addEventListener("visibilitychange", poll);
render(config.initial);
timer = setTimeout(poll, anyActive ? config.pollActiveMs : config.pollIdleMs);
