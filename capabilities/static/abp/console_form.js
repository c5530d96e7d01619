// @ts-check
/**
 * The console's forms: a capability's input schema (JSON Schema) in, a form's fields
 * out, and the call's params read back from them. No I/O and no framework: DOM nodes
 * made with createElement, every text from the schema set as textContent (a
 * description is the host's text, shown as text, never parsed as HTML).
 *
 *   const form = formFor(capability.inputSchema);
 *   element.append(form.element);
 *   const params = form.read();  // throws FieldError, the field marked, when a value is wrong
 *
 * What it draws: strings (an enum as a select, format and pattern as hints, maxLength),
 * numbers and integers (minimum, maximum), booleans, arrays (rows to add and remove),
 * objects (a fieldset), a choice of object variants (oneOf or anyOf, by title or by a
 * const property), binary inputs (a file: `{content: File, mimeType}`, which client.js
 * sends inline or as an upload), defaults, required marks, descriptions as help.
 * Anything else, and whatever is nested deeper than MAX_DEPTH (console_schema.js,
 * which says how each schema is drawn), is a JSON textarea, parsed before the call is
 * sent. What a form cannot say (if/then, allOf,
 * dependentRequired) the server checks: its INVALID_PARAMS names the path.
 * @module abp/console_form
 */

import {
  fits,
  kindOf,
  matches,
  numberProblem,
  optionText,
  resolve,
  typeOf,
  variantLabel,
  variantsOf,
} from "./console_schema.js";
import { isRecord } from "./wire.js";

/** Strings whose maxLength is at most this get a one-line input, longer ones a textarea. */
const ONE_LINE_MAX = 256;
/** Input types for string formats the browser can help with. */
const FORMAT_INPUTS = /** @type {Record<string, string>} */ ({ email: "email", uri: "url", date: "date" });

/** A value the user must fix, with the path of the field it came from. */
export class FieldError extends Error {
  /** @param {string} path @param {string} message */
  constructor(path, message) {
    super(path ? `${path}: ${message}` : message);
    this.name = "FieldError";
    this.path = path;
  }
}

/**
 * @typedef {object} Field
 * @property {HTMLElement} element
 * @property {() => unknown} read The value; `undefined` for a field left empty (the
 *   key is then left out). Throws FieldError, with the field marked, when it is wrong.
 */

/**
 * @typedef {object} Place Where a field sits.
 * @property {Record<string, any>} root The whole schema, for `$ref`s.
 * @property {string} path Dotted, from the params (`options.pageSize`); "" for the root.
 * @property {string} label
 * @property {boolean} required
 * @property {number} depth
 * @property {unknown} initial The value it starts with (the schema's default, or a row's).
 */

let lastId = 0;

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

/**
 * The form for a capability's params: its fields, or one JSON textarea when its schema
 * is not an object with properties. `read()` always gives an object.
 * @param {unknown} inputSchema
 * @returns {Field}
 */
export function formFor(inputSchema) {
  const root = isRecord(inputSchema) ? inputSchema : {};
  const schema = resolve(root, root);
  /** @type {Place} */
  const place = { root, path: "", label: "params", required: true, depth: 0, initial: schema.default };
  const field = kindOf(schema, root) === "object" ? objectField(schema, place) : jsonField(schema, place);
  return {
    element: field.element,
    read() {
      for (const shown of field.element.querySelectorAll(".abp-field-error")) {
        shown.textContent = "";
        /** @type {HTMLElement} */ (shown).hidden = true;
      }
      for (const marked of field.element.querySelectorAll("[aria-invalid]")) marked.removeAttribute("aria-invalid");
      const value = field.read();
      if (value === undefined) return {};
      if (!isRecord(value)) throw fail(field.element, "", "The params must be a JSON object.");
      return value;
    },
  };
}

/**
 * A field of any kind.
 * @param {Record<string, any>} schema @param {Place} place
 * @returns {Field}
 */
export function fieldFor(schema, place) {
  switch (kindOf(schema, place.root, place.depth)) {
    case "const":
      return constField(schema);
    case "enum":
      return enumField(schema, place);
    case "file":
      return fileField(schema, place);
    case "nullable": {
      const variants = /** @type {Record<string, any>[]} */ (variantsOf(schema, place.root));
      const inner = { ...variants[0], description: variants[0].description ?? schema.description };
      return fieldFor(inner, { ...place, required: false, initial: place.initial ?? undefined });
    }
    case "choice":
      return choiceField(schema, place);
    case "string":
      return stringField(schema, place);
    case "number":
      return numberField(schema, place);
    case "boolean":
      return booleanField(schema, place);
    case "object":
      return objectField(schema, place);
    case "array":
      return arrayField(schema, place);
    default:
      return jsonField(schema, place);
  }
}

/**
 * A field's frame: label (with the required mark), control, help, hints, error.
 * @param {Record<string, any>} schema @param {Place} place @param {string} kind
 * @param {HTMLElement} control @param {string[]} [hints]
 */
function frame(schema, place, kind, control, hints = []) {
  const element = make("div", "abp-field");
  element.dataset.kind = kind;
  element.dataset.path = place.path;
  const id = `abp-field-${++lastId}`;
  control.id = id;
  control.setAttribute("name", place.path);
  const label = make("label", "abp-label", place.label);
  label.htmlFor = id;
  if (place.required) label.append(" ", requiredMark());
  if (kind === "boolean") element.append(control, " ", label);
  else element.append(label, control);
  appendHelp(element, schema, hints);
  return element;
}

function requiredMark() {
  const mark = make("abbr", "abp-required", "*");
  mark.title = "required";
  return mark;
}

/** The description as help text, the hints, and the (hidden) error line. @param {HTMLElement} element @param {Record<string, any>} schema @param {string[]} hints */
function appendHelp(element, schema, hints) {
  if (typeof schema.description === "string" && schema.description) {
    element.append(make("p", "abp-help", schema.description));
  }
  const shown = hints.filter(Boolean);
  if (shown.length) element.append(make("p", "abp-hint", shown.join(" · ")));
  const error = make("p", "abp-field-error");
  error.hidden = true;
  error.setAttribute("role", "alert");
  element.append(error);
}

/**
 * Mark a field wrong and make the error to throw.
 * @param {HTMLElement} element The field's frame. @param {string} path @param {string} message
 */
function fail(element, path, message) {
  const shown = /** @type {HTMLElement | null} */ (element.querySelector(":scope > .abp-field-error"));
  if (shown !== null) {
    shown.textContent = message;
    shown.hidden = false;
  }
  const control = element.querySelector(":scope > input, :scope > select, :scope > textarea");
  (control ?? element).setAttribute("aria-invalid", "true");
  return new FieldError(path, message);
}

/** @param {Record<string, any>} schema @returns {Field} */
function constField(schema) {
  const element = make("div", "abp-field");
  element.dataset.kind = "const";
  element.hidden = true;
  return { element, read: () => schema.const };
}

/** @param {Record<string, any>} schema @param {Place} place @returns {Field} */
function enumField(schema, place) {
  const values = /** @type {unknown[]} */ (schema.enum);
  const select = make("select");
  const chosen = values.findIndex((value) => value === place.initial);
  if (!place.required || chosen < 0) {
    const empty = make("option", "", place.required ? "(choose)" : "(not set)");
    empty.value = "";
    select.append(empty);
  }
  values.forEach((value, index) => {
    const option = make("option", "", optionText(value));
    option.value = String(index);
    select.append(option);
  });
  select.value = chosen >= 0 ? String(chosen) : "";
  const element = frame(schema, place, "enum", select);
  return {
    element,
    read() {
      if (select.value === "") {
        if (place.required) throw fail(element, place.path, "Required: choose one.");
        return undefined;
      }
      return values[Number(select.value)];
    },
  };
}

/** @param {Record<string, any>} schema @param {Place} place @returns {Field} */
function stringField(schema, place) {
  const oneLine =
    (typeof schema.maxLength === "number" && schema.maxLength <= ONE_LINE_MAX) ||
    typeof schema.format === "string" ||
    typeof schema.pattern === "string";
  /** @type {HTMLInputElement | HTMLTextAreaElement} */
  let control;
  if (oneLine) {
    control = make("input");
    control.type = FORMAT_INPUTS[schema.format] ?? "text";
  } else {
    control = make("textarea");
    control.rows = typeof schema.maxLength === "number" && schema.maxLength <= 10000 ? 2 : 6;
    control.spellcheck = false;
  }
  if (typeof schema.maxLength === "number") control.maxLength = schema.maxLength;
  if (typeof place.initial === "string") control.value = place.initial;
  if (typeof schema.format === "string" && !(schema.format in FORMAT_INPUTS)) control.placeholder = schema.format;
  const hints = [
    typeof schema.format === "string" ? `format: ${schema.format}` : "",
    typeof schema.pattern === "string" ? `pattern: ${schema.pattern}` : "",
    typeof schema.minLength === "number" && schema.minLength > 1 ? `at least ${schema.minLength} characters` : "",
    typeof schema.maxLength === "number" ? `at most ${schema.maxLength} characters` : "",
  ];
  const element = frame(schema, place, "string", control, hints);
  return {
    element,
    read() {
      const value = control.value;
      if (value === "") {
        if (place.required) throw fail(element, place.path, "Required.");
        return undefined;
      }
      if (typeof schema.minLength === "number" && value.length < schema.minLength) {
        throw fail(element, place.path, `At least ${schema.minLength} characters.`);
      }
      if (typeof schema.pattern === "string" && !matches(schema.pattern, value)) {
        throw fail(element, place.path, `Does not match ${schema.pattern}.`);
      }
      return value;
    },
  };
}

/** @param {Record<string, any>} schema @param {Place} place @returns {Field} */
function numberField(schema, place) {
  const integer = typeOf(schema) === "integer";
  const input = make("input");
  input.type = "number";
  input.step = integer ? "1" : "any";
  if (typeof schema.minimum === "number") input.min = String(schema.minimum);
  if (typeof schema.maximum === "number") input.max = String(schema.maximum);
  if (typeof place.initial === "number") input.value = String(place.initial);
  const hints = [
    integer ? "integer" : "number",
    typeof schema.minimum === "number" ? `≥ ${schema.minimum}` : "",
    typeof schema.exclusiveMinimum === "number" ? `> ${schema.exclusiveMinimum}` : "",
    typeof schema.maximum === "number" ? `≤ ${schema.maximum}` : "",
    typeof schema.exclusiveMaximum === "number" ? `< ${schema.exclusiveMaximum}` : "",
  ];
  const element = frame(schema, place, "number", input, hints);
  return {
    element,
    read() {
      if (input.value === "") {
        // A number input whose text is not a number has the value "" too.
        if (input.validity.badInput) throw fail(element, place.path, "Not a number.");
        if (place.required) throw fail(element, place.path, "Required.");
        return undefined;
      }
      const value = Number(input.value);
      const problem = numberProblem(schema, value, integer);
      if (problem) throw fail(element, place.path, problem);
      return value;
    },
  };
}

/**
 * A checkbox. Unchecked and optional with no default, it is left out (the capability's
 * own default applies); otherwise it is sent as checked.
 * @param {Record<string, any>} schema @param {Place} place @returns {Field}
 */
function booleanField(schema, place) {
  const input = make("input");
  input.type = "checkbox";
  input.checked = place.initial === true;
  const element = frame(schema, place, "boolean", input);
  return {
    element,
    read: () => (input.checked || place.required || typeof schema.default === "boolean" ? input.checked : undefined),
  };
}

/**
 * A file for a binary input: `{content: File, mimeType}`; client.js sends the bytes as
 * base64, or as an upload (docs/uploads.md) when large.
 * @param {Record<string, any>} schema @param {Place} place @returns {Field}
 */
function fileField(schema, place) {
  const input = make("input");
  input.type = "file";
  const element = frame(schema, place, "file", input);
  return {
    element,
    read() {
      const file = input.files?.[0];
      if (file === undefined) {
        if (place.required) throw fail(element, place.path, "Required: choose a file.");
        return undefined;
      }
      return { content: file, mimeType: file.type || "application/octet-stream" };
    },
  };
}

/**
 * A fieldset of the properties. An optional object none of whose fields is set is left out.
 * @param {Record<string, any>} schema @param {Place} place @returns {Field}
 */
function objectField(schema, place) {
  const element = make("fieldset", "abp-field abp-object");
  element.dataset.kind = "object";
  element.dataset.path = place.path;
  if (place.path) {
    const legend = make("legend", "abp-label", place.label);
    if (place.required) legend.append(" ", requiredMark());
    element.append(legend);
  }
  appendHelp(element, place.path ? schema : {}, []);
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const initial = isRecord(place.initial) ? place.initial : {};
  /** @type {[string, Field][]} */
  const fields = Object.entries(schema.properties).map(([name, property]) => {
    const child = resolve(property, place.root);
    const field = fieldFor(child, {
      root: place.root,
      path: place.path ? `${place.path}.${name}` : name,
      label: name,
      required: required.has(name),
      depth: place.depth + 1,
      initial: name in initial ? initial[name] : child.default,
    });
    element.append(field.element);
    return [name, field];
  });
  if (fields.length === 0 && !place.path) element.append(make("p", "abp-help", "No parameters."));
  return {
    element,
    read() {
      /** @type {Record<string, unknown>} */
      const value = {};
      let set = false;
      for (const [name, field] of fields) {
        const item = field.read();
        if (item === undefined) continue;
        value[name] = item;
        // A const alone (a variant's tag) is no sign that the object was filled in.
        if (field.element.dataset.kind !== "const") set = true;
      }
      return set || place.required || !place.path ? value : undefined;
    },
  };
}

/**
 * One of several object variants (oneOf, anyOf): a select of their titles, the chosen
 * one's fields below it.
 * @param {Record<string, any>} schema @param {Place} place @returns {Field}
 */
function choiceField(schema, place) {
  const variants = /** @type {Record<string, any>[]} */ (variantsOf(schema, place.root));
  const select = make("select", "abp-variant");
  variants.forEach((variant, index) => {
    const option = make("option", "", variantLabel(variant, index));
    option.value = String(index);
    select.append(option);
  });
  const start = Math.max(0, variants.findIndex((variant) => fits(variant, place.initial)));
  select.value = String(start);
  const element = frame(schema, place, "choice", select);
  const body = make("div", "abp-variant-body");
  element.insertBefore(body, element.querySelector(":scope > .abp-help, :scope > .abp-hint, :scope > .abp-field-error"));
  /** @type {Field} */
  let current;
  const show = (/** @type {number} */ index, /** @type {unknown} */ initial) => {
    current = objectField(variants[index], { ...place, path: place.path, required: true, depth: place.depth + 1, initial });
    current.element.classList.add("abp-variant-fields");
    current.element.querySelector(":scope > legend")?.remove();
    body.replaceChildren(current.element);
  };
  show(start, place.initial);
  select.addEventListener("change", () => show(Number(select.value), undefined));
  return { element, read: () => current.read() };
}

/**
 * Rows of the items' field, each with Remove; Add appends one (up to maxItems).
 * @param {Record<string, any>} schema @param {Place} place @returns {Field}
 */
function arrayField(schema, place) {
  const items = resolve(schema.items, place.root);
  const element = make("fieldset", "abp-field abp-array");
  element.dataset.kind = "array";
  element.dataset.path = place.path;
  const legend = make("legend", "abp-label", place.label);
  if (place.required) legend.append(" ", requiredMark());
  const list = make("ol", "abp-items");
  const add = make("button", "abp-add", "Add");
  add.type = "button";
  const max = typeof schema.maxItems === "number" ? schema.maxItems : Infinity;
  const min = typeof schema.minItems === "number" ? schema.minItems : 0;
  /** @type {Field[]} */
  const rows = [];
  let made = 0;
  const refresh = () => {
    add.disabled = rows.length >= max;
  };
  const addRow = (/** @type {unknown} */ initial) => {
    const index = made++;
    const field = fieldFor(items, {
      root: place.root,
      path: `${place.path}.${index}`,
      label: `item ${rows.length + 1}`,
      required: true,
      depth: place.depth + 1,
      initial,
    });
    const row = make("li", "abp-item");
    const remove = make("button", "abp-remove", "Remove");
    remove.type = "button";
    remove.addEventListener("click", () => {
      rows.splice(rows.indexOf(field), 1);
      row.remove();
      refresh();
    });
    row.append(field.element, remove);
    list.append(row);
    rows.push(field);
    refresh();
  };
  add.addEventListener("click", () => addRow(items.default));
  const hints = [min > 0 ? `at least ${min} items` : "", Number.isFinite(max) ? `at most ${max} items` : ""];
  element.append(legend);
  appendHelp(element, schema, hints);
  element.insertBefore(list, element.querySelector(":scope > .abp-field-error"));
  element.insertBefore(add, element.querySelector(":scope > .abp-field-error"));
  for (const value of Array.isArray(place.initial) ? place.initial : []) addRow(value);
  return {
    element,
    read() {
      const values = rows.map((row) => {
        const value = row.read();
        if (value === undefined) throw fail(row.element, "", "Empty: fill it in or remove it.");
        return value;
      });
      if (values.length === 0 && !place.required) return undefined;
      if (values.length < min) throw fail(element, place.path, `At least ${min} items.`);
      return values;
    },
  };
}

/**
 * What the form cannot draw: a JSON textarea, parsed when read.
 * @param {Record<string, any>} schema @param {Place} place @returns {Field}
 */
function jsonField(schema, place) {
  const textarea = make("textarea", "abp-json");
  textarea.rows = 4;
  textarea.spellcheck = false;
  if (place.initial !== undefined) textarea.value = JSON.stringify(place.initial, null, 2);
  const element = frame(schema, { ...place, label: `${place.label} (JSON)` }, "json", textarea);
  return {
    element,
    read() {
      const text = textarea.value.trim();
      if (text === "") {
        if (place.required && place.path) throw fail(element, place.path, "Required: a JSON value.");
        return undefined;
      }
      try {
        return JSON.parse(text);
      } catch (error) {
        throw fail(element, place.path, `Not valid JSON: ${error instanceof Error ? error.message : error}`);
      }
    },
  };
}
