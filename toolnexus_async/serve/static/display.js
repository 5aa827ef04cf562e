// The display rules on the page (docs/security.md, "What the inbox shows is what runs").
//
// A request arrives with its `display`, built by the server (serve/_display.py): that form
// is drawn as it is. Every other text a person reads (question options, form labels, a
// run's prompt, step outputs and arguments, answers, the final text) is put through the
// same rules here, so no text on the page escapes them:
//
// - a character that could make the shown text differ from what runs (bidi controls,
//   zero-width and other format characters, controls other than newline and tab, line and
//   paragraph separators, surrogates, private-use and unassigned code points, invisible
//   fillers) becomes a visible, boxed escape such as ⟨U+202E⟩;
// - lines are cut at "\n" only, each its own element; tabs and spaces are kept.
//
// The same categories as serve/_display.py; names only for the usual suspects, since the
// browser has no Unicode name table (the code point says the rest).
import { el } from "./dom.js";

const HIDDEN = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\u034F\u115F\u1160\u17B4\u17B5\u3164\uFFA0]/u;
const HIDDEN_ALL = new RegExp(HIDDEN.source, "gu");
const NAMES = {
  0x00ad: "SOFT HYPHEN",
  0x061c: "ARABIC LETTER MARK",
  0x200b: "ZERO WIDTH SPACE",
  0x200c: "ZERO WIDTH NON-JOINER",
  0x200d: "ZERO WIDTH JOINER",
  0x200e: "LEFT-TO-RIGHT MARK",
  0x200f: "RIGHT-TO-LEFT MARK",
  0x2028: "LINE SEPARATOR",
  0x2029: "PARAGRAPH SEPARATOR",
  0x202a: "LEFT-TO-RIGHT EMBEDDING",
  0x202b: "RIGHT-TO-LEFT EMBEDDING",
  0x202c: "POP DIRECTIONAL FORMATTING",
  0x202d: "LEFT-TO-RIGHT OVERRIDE",
  0x202e: "RIGHT-TO-LEFT OVERRIDE",
  0x2060: "WORD JOINER",
  0x2066: "LEFT-TO-RIGHT ISOLATE",
  0x2067: "RIGHT-TO-LEFT ISOLATE",
  0x2068: "FIRST STRONG ISOLATE",
  0x2069: "POP DIRECTIONAL ISOLATE",
  0xfeff: "ZERO WIDTH NO-BREAK SPACE",
};

function isHidden(char) {
  return char !== "\n" && char !== "\t" && HIDDEN.test(char);
}

function escapeOf(char) {
  const point = char.codePointAt(0);
  const code = `U+${point.toString(16).toUpperCase().padStart(4, "0")}`;
  return { escape: `⟨${code}⟩`, name: NAMES[point] || code };
}

/** One line of text as pieces: strings shown as they are, escapes for hidden characters. */
function piecesOf(line) {
  const pieces = [];
  let start = 0;
  for (const match of line.matchAll(HIDDEN_ALL)) {
    const char = match[0];
    if (!isHidden(char)) continue;
    if (match.index > start) pieces.push(line.slice(start, match.index));
    pieces.push(escapeOf(char));
    start = match.index + char.length;
  }
  if (start < line.length) pieces.push(line.slice(start));
  return pieces;
}

/** `text` as the server's display form has it: a list of lines, each a list of pieces. */
export function escapeLines(text) {
  return String(text ?? "").split("\n").map(piecesOf);
}

/** How many escapes lines (or a whole display form) hold. */
export function hiddenIn(value) {
  if (Array.isArray(value)) return value.reduce((n, v) => n + hiddenIn(v), 0);
  if (value && typeof value === "object") {
    if (typeof value.escape === "string") return 1;
    return Object.values(value).reduce((n, v) => n + hiddenIn(v), 0);
  }
  return 0;
}

/** One line of pieces: strings as text, escapes as marked visible text. */
export function shownLine(pieces, dir, tag = "span", className = "line") {
  const line = el(tag, { class: className, dir });
  for (const piece of pieces) {
    if (typeof piece === "string") line.append(piece);
    else if (piece && typeof piece.escape === "string") {
      line.append(el("span", { class: "escape", title: piece.name, text: piece.escape }));
    }
  }
  return line;
}

/** Lines of pieces as line elements; `dir` is "ltr" for code, "auto" for prose. */
export function shownLines(lines, dir) {
  return (Array.isArray(lines) ? lines : []).map((pieces) => shownLine(pieces, dir));
}

/**
 * Any text by the rules, in a `tag` element of class "shown" (and "code" for code): one
 * line element per line. `inline` keeps it to one span (a label, an option): its lines
 * still show apart, its escapes still show.
 */
export function shownText(text, { tag = "div", code = false, inline = false, className } = {}) {
  const classes = ["shown", code ? "code" : null, inline ? "inline" : null, className];
  const box = el(inline ? "span" : tag, { class: classes.filter(Boolean).join(" ") });
  const lines = shownLines(escapeLines(text), code ? "ltr" : "auto");
  // Inline, each line is an inline element and a kept "\n" (white-space: pre-wrap) breaks
  // between them, so a one-line text flows with the words around it.
  lines.forEach((line, i) => box.append(...(inline && i > 0 ? ["\n", line] : [line])));
  return box;
}

/** A JSON value shown by the rules: its exact JSON, indented, strings with their quotes. */
export function shownJSON(value) {
  return shownText(JSON.stringify(value, null, 2) ?? "null", { code: true });
}

/** The warning line of a card that shows `count` escapes; null for none. */
export function warningLine(count, what = "This request") {
  if (!(count > 0)) return null;
  const noun =
    count === 1
      ? "1 invisible or direction-changing character"
      : `${count} invisible or direction-changing characters`;
  const text = `⚠ ${what} contains ${noun}, shown as ⟨U+…⟩.`;
  return el("p", { class: "warning", role: "note", text });
}

/**
 * A value's JSON for a person to edit in a plain text box: hidden characters written as
 * JSON \u escapes (a text box would draw them raw), which JSON.parse turns back into
 * exactly the same characters.
 */
export function jsonForEditing(value) {
  const text = JSON.stringify(value, null, 2) ?? "null";
  return text.replace(HIDDEN_ALL, (char) => {
    if (!isHidden(char)) return char;
    let out = "";
    for (let i = 0; i < char.length; i += 1) {
      out += `\\u${char.charCodeAt(i).toString(16).toUpperCase().padStart(4, "0")}`;
    }
    return out;
  });
}

// How many lines of a diff show before "Show all N lines".
const DIFF_LINES_SHOWN = 200;
// Data shown in a fixed-width font, where a space or a quote must be seen as it is.
const CODE_KEYS = new Set(["command", "workdir", "path", "changes"]);

/** A diff: one element per line, marked by class and by its +/- gutter, not by color. */
export function shownDiff(lines) {
  const box = el("div", { class: "diff" });
  const line = ({ mark, pieces }) => {
    const row = el("div", { class: `diff-line ${mark}`, dir: "ltr", "data-mark": mark });
    let rest = pieces;
    if (["add", "del", "context"].includes(mark) && typeof pieces[0] === "string") {
      row.append(el("span", { class: "gutter", text: pieces[0].charAt(0) }));
      rest = [pieces[0].slice(1), ...pieces.slice(1)];
    }
    row.append(shownLine(rest, "ltr", "span", "code"));
    return row;
  };
  box.append(...lines.slice(0, DIFF_LINES_SHOWN).map(line));
  if (lines.length > DIFF_LINES_SHOWN) {
    const more = lines.length - DIFF_LINES_SHOWN;
    const button = el("button", { type: "button", class: "show-all" });
    button.textContent = `Show all ${lines.length} lines (${more} more)`;
    button.addEventListener("click", () => {
      button.replaceWith(...lines.slice(DIFF_LINES_SHOWN).map(line));
    });
    box.append(button);
  }
  return box;
}

/** One field of a request's display form as a <dd>. */
export function shownField(field, value) {
  if (field.kind === "diff") {
    return el("dd", {}, shownDiff(Array.isArray(field.lines) ? field.lines : []));
  }
  if (field.kind === "text" || field.kind === "json") {
    const code = field.kind === "json" || CODE_KEYS.has(field.key);
    const lines = shownLines(field.lines, code ? "ltr" : "auto");
    return el("dd", { class: code ? "shown code" : "shown" }, ...lines);
  }
  return el("dd", {}, shownText(valueText(value), { inline: true }));
}

/** A data value for people: numbers with separators, yes/no, lists joined, else JSON. */
export function valueText(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "number") return value.toLocaleString();
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (Array.isArray(value) && value.every((v) => typeof v !== "object" || v === null)) {
    return value.map(valueText).join(", ");
  }
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

/** A data value by the rules: text for plain values, indented JSON for nested ones. */
export function shownValue(value) {
  const nested =
    value !== null &&
    typeof value === "object" &&
    !(Array.isArray(value) && value.every((v) => typeof v !== "object" || v === null));
  return nested ? shownJSON(value) : shownText(valueText(value));
}
