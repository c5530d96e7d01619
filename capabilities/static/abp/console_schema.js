// @ts-check
/**
 * What the console's forms (console_form.js) read from a JSON Schema, without the DOM:
 * how each schema is drawn (`kindOf`), local `$ref`s followed, the variants of a
 * oneOf or anyOf, and the checks made before a call is sent (numbers' bounds, a
 * pattern). Pure functions of the schema and a value.
 * @module abp/console_schema
 */

import { isRecord } from "./wire.js";

/** Nesting drawn as fields; deeper (or recursive) schemas are JSON textareas. */
export const MAX_DEPTH = 8;

/** Whether a value is a JSON scalar (an enum or const the form can offer). @param {unknown} value */
export function isScalar(value) {
  return value === null || ["string", "number", "boolean"].includes(typeof value);
}

/**
 * The schema a local `$ref` (`#/$defs/Name`) points at, followed until there is none;
 * `{}` (anything: a JSON textarea) for one that cannot be followed.
 * @param {unknown} schema @param {Record<string, any>} root
 * @returns {Record<string, any>}
 */
export function resolve(schema, root) {
  let current = schema;
  for (let hops = 0; isRecord(current) && typeof current.$ref === "string"; hops++) {
    if (hops > MAX_DEPTH || !current.$ref.startsWith("#")) return {};
    /** @type {unknown} */
    let target = root;
    for (const part of current.$ref.slice(1).split("/").filter(Boolean)) {
      const key = decodeURIComponent(part).replaceAll("~1", "/").replaceAll("~0", "~");
      target = isRecord(target) ? target[key] : undefined;
    }
    current = target;
  }
  return isRecord(current) ? current : {};
}

/**
 * The one JSON type a schema names: `"integer"`, or `"integer"` of
 * `["integer", "null"]`; null when it names none or several.
 * @param {Record<string, any>} schema
 */
export function typeOf(schema) {
  const types = Array.isArray(schema.type) ? schema.type.filter((type) => type !== "null") : [schema.type];
  return types.length === 1 && typeof types[0] === "string" ? types[0] : null;
}

/** A binary input: `{content: base64 string, mimeType, ...}` (capabilities/work/schemas.py). @param {Record<string, any>} schema */
export function isBinary(schema) {
  const content = isRecord(schema.properties) ? resolve(schema.properties.content, {}) : {};
  return typeOf(schema) === "object" && content.contentEncoding === "base64";
}

/** The variants of a oneOf or anyOf, `null` ones left out. @param {Record<string, any>} schema @param {Record<string, any>} root */
export function variantsOf(schema, root) {
  const listed = Array.isArray(schema.oneOf) ? schema.oneOf : Array.isArray(schema.anyOf) ? schema.anyOf : null;
  if (listed === null) return null;
  return listed.map((variant) => resolve(variant, root)).filter((variant) => variant.type !== "null");
}

/**
 * How a schema is drawn.
 * @param {Record<string, any>} schema @param {Record<string, any>} root @param {number} depth
 * @returns {"const" | "enum" | "file" | "nullable" | "choice" | "string" | "number" | "boolean" | "object" | "array" | "json"}
 */
export function kindOf(schema, root, depth = 0) {
  if (depth > MAX_DEPTH) return "json";
  if ("const" in schema && isScalar(schema.const)) return "const";
  if (Array.isArray(schema.enum) && schema.enum.length > 0 && schema.enum.every(isScalar)) return "enum";
  if (isBinary(schema)) return "file";
  const variants = variantsOf(schema, root);
  if (variants !== null) {
    const listed = schema.oneOf ?? schema.anyOf;
    if (variants.length === 1 && listed.length === 2) return "nullable";
    const drawable = variants.length > 0 && variants.every((variant) => kindOf(variant, root, depth + 1) === "object");
    return drawable ? "choice" : "json";
  }
  switch (typeOf(schema)) {
    case "string":
      return "string";
    case "number":
    case "integer":
      return "number";
    case "boolean":
      return "boolean";
    case "object":
      return isRecord(schema.properties) ? "object" : "json";
    case "array": {
      const items = resolve(schema.items, root);
      const kind = isRecord(schema.items) ? kindOf(items, root, depth + 1) : "json";
      return kind === "json" || kind === "file" ? "json" : "array";
    }
    default:
      return "json";
  }
}

/**
 * What is wrong with a number for its schema, or "".
 * @param {Record<string, any>} schema @param {number} value @param {boolean} integer
 */
export function numberProblem(schema, value, integer) {
  if (!Number.isFinite(value)) return "Not a number.";
  if (integer && !Number.isInteger(value)) return "A whole number.";
  if (typeof schema.minimum === "number" && value < schema.minimum) return `At least ${schema.minimum}.`;
  if (typeof schema.maximum === "number" && value > schema.maximum) return `At most ${schema.maximum}.`;
  if (typeof schema.exclusiveMinimum === "number" && value <= schema.exclusiveMinimum) {
    return `More than ${schema.exclusiveMinimum}.`;
  }
  if (typeof schema.exclusiveMaximum === "number" && value >= schema.exclusiveMaximum) {
    return `Less than ${schema.exclusiveMaximum}.`;
  }
  return "";
}

/** A JSON Schema pattern (ECMA-262, unanchored); one the browser cannot compile passes. @param {string} pattern @param {string} value */
export function matches(pattern, value) {
  try {
    return new RegExp(pattern, "u").test(value);
  } catch {
    return true; // the server judges it
  }
}

/** A scalar as an option's text: a string as it is, the rest as JSON. @param {unknown} value */
export function optionText(value) {
  return typeof value === "string" ? value : JSON.stringify(value);
}

/** A variant's name in the choice: its title, else its const property. @param {Record<string, any>} variant @param {number} index */
export function variantLabel(variant, index) {
  if (typeof variant.title === "string" && variant.title) return variant.title;
  for (const [name, property] of Object.entries(isRecord(variant.properties) ? variant.properties : {})) {
    if (isRecord(property) && "const" in property) return `${name}: ${optionText(property.const)}`;
  }
  return `option ${index + 1}`;
}

/** Whether a value has the variant's const properties. @param {Record<string, any>} variant @param {unknown} value */
export function fits(variant, value) {
  if (!isRecord(value)) return false;
  const properties = isRecord(variant.properties) ? Object.entries(variant.properties) : [];
  const consts = properties.filter(([, property]) => isRecord(property) && "const" in property);
  return consts.length > 0 && consts.every(([name, property]) => value[name] === property.const);
}
