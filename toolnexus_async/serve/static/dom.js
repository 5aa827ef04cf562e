// Small DOM and text helpers shared by the page's modules.
//
// Server data is only ever inserted as text (el() uses text nodes and setAttribute), never
// parsed as HTML, so a prompt containing "<script>" shows up as those characters.

let nextId = 0;

/** Build an element. Strings among the children become text nodes (safe by construction). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (typeof value === "function") node.addEventListener(key.replace(/^on/, ""), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
}

/** A fresh element id; request ids come from the server and may hold any character. */
export function uid() {
  nextId += 1;
  return `tn-${nextId}`;
}

/** Only http(s) links: a "javascript:" URL in a request must never become clickable. */
export function safeUrl(raw) {
  if (typeof raw !== "string") return null;
  try {
    const url = new URL(raw, window.location.href);
    return url.protocol === "http:" || url.protocol === "https:" ? url : null;
  } catch {
    return null;
  }
}

/** `text` cut to `limit` code points (never inside a surrogate pair); `cut` says if it was. */
export function cutText(text, limit) {
  const s = typeof text === "string" ? text : JSON.stringify(text) ?? "";
  if (s.length <= limit) return { text: s, cut: false };
  const points = Array.from(s);
  if (points.length <= limit) return { text: s, cut: false };
  return { text: points.slice(0, limit).join(""), cut: true };
}

/** A time for people: the server's unix seconds (or an ISO string) in local time. */
export function timeText(when) {
  if (when === null || when === undefined || when === "") return "";
  const date = typeof when === "number" ? new Date(when * 1000) : new Date(when);
  if (Number.isNaN(date.getTime())) return String(when);
  const today = new Date().toDateString() === date.toDateString();
  return today ? date.toLocaleTimeString() : date.toLocaleString();
}

// Currency codes and other short words that a key ends with and a label shows in capitals.
const UNIT_WORDS = new Set(["eur", "usd", "gbp", "chf", "jpy", "id", "url"]);

/** A data key as a label: "amount_eur" -> "Amount (EUR)", "partySize" -> "Party size". */
export function labelOf(key) {
  const words = String(key)
    .replace(/([a-z0-9])([A-Z])/g, "$1 $2")
    .split(/[_\s-]+/)
    .filter(Boolean)
    .map((w) => w.toLowerCase());
  if (words.length === 0) return String(key);
  let unit = "";
  if (words.length > 1 && UNIT_WORDS.has(words[words.length - 1])) {
    unit = ` (${words.pop().toUpperCase()})`;
  }
  const text = words.map((w) => (UNIT_WORDS.has(w) ? w.toUpperCase() : w)).join(" ");
  return `${text.charAt(0).toUpperCase()}${text.slice(1)}${unit}`;
}

/** Call `fn` once, `ms` after the last of a burst of calls. */
export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}
