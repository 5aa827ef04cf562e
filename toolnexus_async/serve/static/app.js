// The inbox page: start runs, answer what they ask, watch them finish.
//
// Plain JavaScript, no framework and no build step. Server data is only ever inserted as
// text (el() below uses text nodes and setAttribute), never parsed as HTML, so a prompt
// containing "<script>" shows up as those characters.
//
// What a request shows (its prompt, data and URL) is drawn from its `display`, the form the
// server builds by the display rules (serve/_display.py, docs/security.md): hidden
// characters arrive as escapes and are drawn as visible text, lines as separate elements;
// this page decides none of that. It only cuts a long diff, and then says so and offers
// the rest.
"use strict";

const requestsList = document.getElementById("requests");
const runsList = document.getElementById("runs");
const startForm = document.getElementById("start-form");
const promptBox = document.getElementById("prompt");
const connection = document.getElementById("connection");
const logoutButton = document.getElementById("logout");

const requestCards = new Map(); // request id -> its <li>
const answeredIds = new Set(); // so a re-sync that raced an answer cannot bring a card back
const runs = new Map(); // run id -> {li, data, steps: Map(call id -> <li>)}
const FINAL = new Set(["done", "incomplete", "error"]);
const STATUS_LABELS = { pending: "waiting for an answer" };
// Runs whose steps are fetched (GET /runs/{id}) after a reload: the newest ones.
const STEPS_ON_LOAD = 50;
// The server restarted with a new token, say: only the printed address logs in again.
const LOGGED_OUT =
  "Not logged in: open the address that toolnexus-async serve printed (…/?token=…).";
let nextId = 0;
let loggedOut = false;
let eventSource = null;

// ---- small helpers ----

/** Build an element. Strings among the children become text nodes (safe by construction). */
function el(tag, attrs = {}, ...children) {
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
function uid() {
  nextId += 1;
  return `tn-${nextId}`;
}

/** Only http(s) links: a "javascript:" URL in a request must never become clickable. */
function safeUrl(raw) {
  if (typeof raw !== "string") return null;
  try {
    const url = new URL(raw, window.location.href);
    return url.protocol === "http:" || url.protocol === "https:" ? url : null;
  } catch {
    return null;
  }
}

/** A 401: the page has no (valid) login cookie any more. */
function noteStatus(status) {
  if (status !== 401) return;
  loggedOut = true;
  connection.textContent = LOGGED_OUT;
  connection.dataset.state = "down";
}

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  noteStatus(response.status);
  if (!response.ok) throw new Error(`GET ${path}: HTTP ${response.status}`);
  return response.json();
}

/** POST JSON; resolves to {ok, status, payload} for any HTTP status (errors are data here). */
async function postJSON(path, body) {
  const response = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(body),
  });
  noteStatus(response.status);
  let payload = null;
  try {
    payload = await response.json();
  } catch {
    // A proxy's HTML error page, say: the status alone will have to do.
  }
  return { ok: response.ok, status: response.status, payload };
}

function errorText(result) {
  const why = typeof result.payload?.error === "string" ? result.payload.error : "";
  return why ? `${why} (HTTP ${result.status})` : `HTTP ${result.status}`;
}

function showError(box, message) {
  box.textContent = message;
  box.hidden = !message;
}

function updateEmptyNotes() {
  document.getElementById("requests-empty").hidden = requestCards.size > 0;
  document.getElementById("runs-empty").hidden = runs.size > 0;
}

// ---- requests ----

const KIND_TITLES = {
  approval: "Approval needed",
  question: "Question",
  authorization: "Login needed",
  input: "Details needed",
};

function showRequest(request) {
  if (!request || typeof request.id !== "string") return;
  // The event stream and a re-sync may both deliver the same request.
  if (requestCards.has(request.id) || answeredIds.has(request.id)) return;
  const card = buildRequestCard(request);
  requestCards.set(request.id, card);
  requestsList.append(card); // oldest first: answer in the order they were asked
  if (request.run_id) updateRun({ id: request.run_id, status: "pending" });
  updateEmptyNotes();
}

function removeRequest(id) {
  answeredIds.add(id);
  const card = requestCards.get(id);
  if (!card) return;
  card.remove();
  requestCards.delete(id);
  // The run is no longer waiting on anyone once its last request is gone.
  const runId = card.dataset.run;
  const stillWaiting = [...requestCards.values()].some((c) => c.dataset.run === runId);
  const run = runs.get(runId);
  if (run && !stillWaiting && run.data.status === "pending") {
    updateRun({ id: runId, status: "running" });
  }
  updateEmptyNotes();
}

function buildRequestCard(request) {
  const headingId = uid();
  const promptId = uid();
  const card = el("li", {
    class: "card request",
    "data-request": request.id, // for tests and styles; set as an attribute, never parsed
    "data-kind": request.kind,
    "data-run": request.run_id,
    "aria-labelledby": headingId,
  });
  card.append(
    el("h3", { id: headingId, text: KIND_TITLES[request.kind] || `Request: ${request.kind}` }),
  );
  const display = displayOf(request);
  if (display.hidden > 0) {
    const count =
      display.hidden === 1
        ? "1 invisible or direction-changing character"
        : `${display.hidden} invisible or direction-changing characters`;
    const warning = `⚠ This request contains ${count}, shown as ⟨U+…⟩.`;
    card.append(el("p", { class: "warning", role: "note", text: warning }));
  } else if (display.missing) {
    const warning =
      "⚠ This request came without its display form: hidden characters are not marked.";
    card.append(el("p", { class: "warning", role: "note", text: warning }));
  }
  // A question's form shows each question itself: its prompt (the same questions in one
  // line) would say everything twice.
  const questions = request.kind === "question" && Array.isArray(request.data?.questions);
  if (!questions || request.data.questions.length === 0) {
    const lines = shownLines(display.prompt, "auto");
    card.append(el("div", { id: promptId, class: "prompt" }, ...lines));
  }
  // Which run asks: its prompt, in words (the run id only until the prompt is known).
  const runPrompt = el("span", { class: "run-prompt" });
  const expiry = expiryText(request.expiresAt);
  card.append(el("p", { class: "meta" }, runPrompt, expiry && request.run_id ? " · " : "", expiry));
  card.runPrompt = runPrompt;
  showRunPrompt(card, runs.get(request.run_id)?.data.prompt);

  const errorBox = el("p", { class: "error", role: "alert", hidden: true });
  const send = (body) => answer(request, card, errorBox, body);
  const build = BUILDERS[request.kind] || approvalControls;
  const describedBy = card.querySelector(`#${promptId}`) ? promptId : headingId;
  card.append(...build(request, send, describedBy), errorBox);
  return card;
}

function showRunPrompt(card, prompt) {
  const runId = card.dataset.run;
  if (!runId || !card.runPrompt) return;
  card.runPrompt.textContent = prompt ? `for “${shorten(prompt, 120)}”` : `run ${runId}`;
}

function expiryText(expiresAt) {
  if (!expiresAt) return "";
  const when = new Date(expiresAt);
  return `expires ${Number.isNaN(when.getTime()) ? expiresAt : when.toLocaleTimeString()}`;
}

function setBusy(card, busy) {
  for (const control of card.querySelectorAll("button, input, select, textarea")) {
    control.disabled = busy;
  }
}

async function answer(request, card, errorBox, body) {
  setBusy(card, true);
  showError(errorBox, "");
  let result;
  try {
    result = await postJSON(`/requests/${encodeURIComponent(request.id)}/answer`, body);
  } catch (err) {
    showError(errorBox, `Could not reach the server: ${err.message}`);
    setBusy(card, false);
    return;
  }
  if (result.ok) {
    removeRequest(request.id);
    if (body.ok === false && request.run_id) updateRun({ id: request.run_id, declined: true });
    return;
  }
  if (result.status === 404 || result.status === 409) {
    // Unknown, already answered or expired: no answer can succeed, so offer to dismiss it.
    showError(errorBox, `This request can no longer be answered: ${errorText(result)}`);
    const dismiss = actionButton("Dismiss", () => removeRequest(request.id), null);
    card.append(el("div", { class: "actions" }, dismiss));
  } else {
    // 422 and friends: the answer was malformed; let the person correct it and retry.
    showError(errorBox, `The answer was not accepted: ${errorText(result)}`);
    setBusy(card, false);
  }
}

function approving(data) {
  if (typeof data.digest !== "string") return { ok: true };
  return { ok: true, data: { digest: data.digest } };
}

function actionButton(label, onclick, describedBy, primary = false) {
  const attrs = { type: "button", class: primary ? "primary" : null, "aria-describedby": describedBy };
  return el("button", { ...attrs, onclick }, label);
}

// ---- showing a request's display form ----

// How many lines of a diff show before "Show all N lines".
const DIFF_LINES_SHOWN = 200;
// Data shown in a fixed-width font, where a space or a quote must be seen as it is.
const CODE_KEYS = new Set(["command", "workdir", "path", "changes"]);

/** The request's display form; one that lacks it is shown as plain text, with a warning. */
function displayOf(request) {
  const display = request.display;
  if (display && Array.isArray(display.prompt) && Array.isArray(display.fields)) return display;
  // Only a server older or newer than this page sends none: the prompt alone, not trusted.
  return { hidden: 0, prompt: [[String(request.prompt ?? "")]], fields: [], missing: true };
}

/** One line of pieces: strings as text, escapes as marked visible text. */
function shownLine(pieces, dir, tag = "span", className = "line") {
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
function shownLines(lines, dir) {
  return (Array.isArray(lines) ? lines : []).map((pieces) => shownLine(pieces, dir));
}

/** A diff: one element per line, marked by class and by its +/- gutter, not by color. */
function shownDiff(lines) {
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

function shownField(field, value) {
  if (field.kind === "diff") {
    return el("dd", {}, shownDiff(Array.isArray(field.lines) ? field.lines : []));
  }
  if (field.kind === "text" || field.kind === "json") {
    const code = field.kind === "json" || CODE_KEYS.has(field.key);
    const lines = shownLines(field.lines, code ? "ltr" : "auto");
    return el("dd", { class: code ? "shown code" : "shown" }, ...lines);
  }
  return el("dd", { text: valueText(value) });
}

/** Approve / Decline; also the fallback for kinds this page does not know. */
function approvalControls(request, send, promptId) {
  const parts = [];
  const data = request.data && typeof request.data === "object" ? request.data : {};
  const details = el("dl", { class: "details" });
  for (const field of displayOf(request).fields) {
    details.append(el("dt", { text: labelOf(field.key) }), shownField(field, data[field.key]));
  }
  if (details.childElementCount) parts.push(details);
  parts.push(
    el(
      "div",
      { class: "actions" },
      // The approval names the digest of what this card showed: the server refuses it
      // if the request is for anything else (a stale page, a crossed answer).
      actionButton("Approve", () => send(approving(data)), promptId, true),
      actionButton("Decline", () => send({ ok: false, reason: "declined" }), promptId),
    ),
  );
  return parts;
}

// Currency codes and other short words that a key ends with and a label shows in capitals.
const UNIT_WORDS = new Set(["eur", "usd", "gbp", "chf", "jpy", "id", "url"]);

/** A data key as a label: "amount_eur" -> "Amount (EUR)", "partySize" -> "Party size". */
function labelOf(key) {
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

/** A data value for people: numbers with separators, yes/no, lists joined, else JSON. */
function valueText(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "number") return value.toLocaleString();
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (Array.isArray(value) && value.every((v) => typeof v !== "object" || v === null)) {
    return value.map(valueText).join(", ");
  }
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

function authorizationControls(request, send, promptId) {
  const url = safeUrl(request.url);
  const link = url
    ? el(
        "p",
        {},
        // A new tab, and the login page gets no handle on (or referrer from) this page.
        el(
          "a",
          { class: "login-link", href: url.href, target: "_blank", rel: "noopener noreferrer" },
          "Open the login page",
        ),
        el("span", { class: "hint", text: ` ${url.host} · opens in a new tab` }),
        el("span", { class: "url" }, ...shownLines(displayOf(request).url, "ltr")),
      )
    : el("p", { class: "error", text: "This request came without a usable login link." });
  return [
    link,
    el(
      "div",
      { class: "actions" },
      actionButton("Done, I logged in", () => send({ ok: true }), promptId, true),
      actionButton("Cancel", () => send({ ok: false, reason: "cancelled" }), promptId),
    ),
  ];
}

/** A form with a submit button and a Decline button; `collect` turns it into the answer's data. */
function answerForm(send, promptId, fill, submitLabel) {
  const form = el("form", { class: "answer-form", "aria-describedby": promptId });
  const collect = fill(form);
  form.append(
    el(
      "div",
      { class: "actions" },
      el("button", { type: "submit", class: "primary" }, submitLabel),
      actionButton("Decline", () => send({ ok: false, reason: "declined" }), promptId),
    ),
  );
  // The browser checks required/min/max/step before "submit" fires.
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    send({ ok: true, data: collect() });
  });
  return form;
}

function questionControls(request, send, promptId) {
  const questions = Array.isArray(request.data?.questions) ? request.data.questions : [];
  const fill = (form) => {
    const readers = questions.map((question) => addQuestion(form, question || {}));
    return () => ({ answers: readers.map((read) => read()) });
  };
  return [answerForm(send, promptId, fill, "Send answers")];
}

/** One question: radio buttons or checkboxes from its options, a text input otherwise. */
function addQuestion(form, question) {
  const text = String(question.question ?? "");
  const header = question.header ? String(question.header) : "";
  const options = (Array.isArray(question.options) ? question.options : []).map((option) =>
    typeof option === "string"
      ? { label: option }
      : { label: String(option?.label ?? ""), description: option?.description },
  );
  if (options.length === 0) {
    const id = uid();
    const input = el("input", { id, type: "text", required: true, autocomplete: "off" });
    const label = el("label", { for: id, text: header ? `${header}: ${text}` : text });
    form.append(el("div", { class: "field" }, label, input));
    return () => input.value;
  }
  const multiple = question.multiple === true;
  const group = uid(); // one radio group per question
  const fieldset = el("fieldset", {}, el("legend", { text: header || text }));
  if (header) fieldset.append(el("p", { class: "hint", text }));
  const inputs = options.map((option) => {
    // Radios are required (one must be picked); checkboxes may all stay empty.
    const type = multiple ? "checkbox" : "radio";
    const input = el("input", { type, name: group, value: option.label, required: !multiple });
    fieldset.append(
      el(
        "label",
        { class: "option" },
        input,
        el("span", { text: option.label }),
        option.description ? el("span", { class: "hint", text: ` ${option.description}` }) : null,
      ),
    );
    return input;
  });
  form.append(fieldset);
  if (multiple) return () => inputs.filter((i) => i.checked).map((i) => i.value);
  return () => inputs.find((i) => i.checked)?.value ?? "";
}

function inputControls(request, send, promptId) {
  const data = request.data || {};
  const schema = data.schema || {};
  const properties = typeof schema.properties === "object" ? schema.properties || {} : {};
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const defaults = data.default && typeof data.default === "object" ? data.default : {};
  const fill = (form) => {
    if (required.size) form.append(el("p", { class: "hint", text: "* required" }));
    const readers = Object.entries(properties).map(([name, prop]) => {
      const initial = name in defaults ? defaults[name] : prop?.default;
      return [name, addField(form, name, prop || {}, required.has(name), initial)];
    });
    return () => {
      const values = {};
      for (const [name, read] of readers) {
        const value = read();
        if (value !== undefined) values[name] = value; // an empty optional field is left out
      }
      return values;
    };
  };
  return [answerForm(send, promptId, fill, "Submit")];
}

/** One schema property as a labelled input; returns a reader giving the typed value. */
function addField(form, name, prop, isRequired, initial) {
  const id = uid();
  const hintId = prop.description ? uid() : null;
  const type = Array.isArray(prop.type) ? prop.type.find((t) => t !== "null") : prop.type;
  const label = el(
    "label",
    { for: id },
    String(prop.title || name),
    isRequired ? el("span", { class: "required", "aria-hidden": "true", text: " *" }) : null,
  );
  const hint = hintId ? el("p", { id: hintId, class: "hint", text: prop.description }) : null;
  const common = { id, name, "aria-describedby": hintId };
  let input;
  let read;
  if (type === "boolean") {
    input = el("input", { ...common, type: "checkbox", checked: initial === true });
    read = () => input.checked;
    form.append(el("div", { class: "field checkbox" }, input, label, hint));
    return read;
  }
  if (type === "integer" || type === "number") {
    input = el("input", {
      ...common,
      type: "number",
      step: type === "integer" ? "1" : "any",
      min: prop.minimum,
      max: prop.maximum,
      required: isRequired,
      value: typeof initial === "number" ? initial : null,
    });
    read = () => (input.value === "" ? undefined : Number(input.value));
  } else {
    input = el("input", {
      ...common,
      type: "text",
      required: isRequired,
      value: initial === undefined || initial === null ? null : String(initial),
      autocomplete: "off",
    });
    read = () => (input.value === "" && !isRequired ? undefined : input.value);
  }
  form.append(el("div", { class: "field" }, label, input, hint));
  return read;
}

const BUILDERS = {
  approval: approvalControls,
  question: questionControls,
  authorization: authorizationControls,
  input: inputControls,
};

// ---- runs ----

function runEntry(id) {
  let entry = runs.get(id);
  if (entry) return entry;
  const li = el("li", { class: "card run" });
  entry = {
    li,
    data: { id },
    steps: new Map(),
    status: el("span", { class: "status" }),
    prompt: el("span", { class: "prompt" }),
    stepList: el("ol", { class: "steps" }),
    text: el("p", { class: "result", hidden: true }),
    error: el("p", { class: "error", hidden: true }),
  };
  li.append(
    el("div", { class: "run-head" }, entry.status, entry.prompt),
    entry.stepList,
    entry.text,
    entry.error,
    el("p", { class: "meta", text: `run ${id}` }),
  );
  runs.set(id, entry);
  runsList.prepend(li); // newest first, like GET /runs
  updateEmptyNotes();
  return entry;
}

/** Merge what is known about a run and redraw it. `ifNew` fields only fill a fresh entry. */
function updateRun(run, ifNew = {}) {
  if (!run || typeof run.id !== "string") return null;
  const fresh = !runs.has(run.id);
  const entry = runEntry(run.id);
  const data = entry.data;
  for (const [key, value] of Object.entries(run)) {
    if (value === undefined || value === null || key === "steps") continue;
    // A stale snapshot (a re-sync racing "done") must not un-finish a run.
    if (key === "status" && FINAL.has(data.status) && !FINAL.has(value)) continue;
    // Once a request of the run was declined, it stays so.
    if (key === "declined") data.declined = data.declined === true || value === true;
    else data[key] = value;
  }
  if (fresh) for (const [key, value] of Object.entries(ifNew)) data[key] ??= value;
  // A run that ended "done" after a refusal did not do all it was asked: not a success.
  const status =
    data.status === "done" && data.declined ? "declined" : data.status || "running";
  entry.li.dataset.status = status;
  entry.status.textContent = STATUS_LABELS[status] || status;
  for (const card of requestCards.values()) {
    if (card.dataset.run === run.id) showRunPrompt(card, data.prompt);
  }
  entry.prompt.textContent = data.prompt || "";
  entry.text.textContent = data.text || "";
  entry.text.hidden = !data.text;
  entry.error.textContent = data.error ? `Error: ${data.error}` : "";
  entry.error.hidden = !data.error;
  return entry;
}

function toolStep(runId, callId, name) {
  const entry = runEntry(runId);
  let step = entry.steps.get(callId);
  if (!step) {
    step = el("li", {}, el("span", { class: "tool", text: name }), el("span", { class: "output" }));
    entry.steps.set(callId, step);
    entry.stepList.append(step);
  }
  return step;
}

/** A step's outcome in words: a refusal is "declined", never the model's own text of it. */
function showStep(step, { output, is_error: isError, declined }, ended) {
  step.dataset.error = isError ? "true" : "false";
  step.dataset.declined = declined ? "true" : "false";
  let text;
  if (declined) text = " → declined";
  else if (typeof output === "string") text = ` → ${shorten(output)}`;
  else text = ended ? " → answered" : " …"; // the store keeps no output (or none yet)
  step.querySelector(".output").textContent = text;
}

/** Rebuild a run's steps from GET /runs/{id}, in their order (after a reload or restart). */
async function loadSteps(runId) {
  const run = await getJSON(`/runs/${encodeURIComponent(runId)}`);
  const entry = updateRun(run);
  if (!entry || !Array.isArray(run.steps)) return;
  for (const s of run.steps) {
    if (!s || typeof s.id !== "string") continue;
    const step = toolStep(runId, s.id, String(s.name ?? ""));
    const live = step.dataset.error !== undefined; // an event said more already
    if (!live || typeof s.output === "string") showStep(step, s, FINAL.has(run.status));
    entry.stepList.append(step); // moves it: the list ends in the server's order
  }
}

function shorten(text, limit = 160) {
  const s = typeof text === "string" ? text : JSON.stringify(text);
  return s.length > limit ? `${s.slice(0, limit)}…` : s;
}

// ---- loading and the live event stream ----

async function syncRequests() {
  const { requests } = await getJSON("/requests");
  const live = new Set(requests.map((r) => r.id));
  for (const id of [...requestCards.keys()]) if (!live.has(id)) removeRequest(id);
  requests.forEach(showRequest);
}

async function syncRuns() {
  const list = (await getJSON("/runs")).runs;
  // Appending moves existing items too, so the list ends up in the server's (newest first) order.
  for (const run of list) {
    const entry = updateRun(run);
    if (entry) runsList.append(entry.li);
  }
  // Steps are not in the list: fetch them for the newest runs (each on its own).
  for (const run of list.slice(0, STEPS_ON_LOAD)) {
    if (typeof run?.id === "string") loadSteps(run.id).catch(() => {});
  }
}

async function resync() {
  try {
    await Promise.all([syncRequests(), syncRuns()]);
  } catch (err) {
    if (!loggedOut) connection.textContent = `Could not load: ${err.message}`;
  }
}

const HANDLERS = {
  run_started: (e) => updateRun({ id: e.run_id, prompt: e.prompt }, { status: "running" }),
  pending: (e) => showRequest({ run_id: e.run_id, ...e.request }),
  tool_call: (e) => {
    const step = toolStep(e.run_id, e.id, e.name);
    step.querySelector(".output").textContent = " …";
  },
  tool_result: (e) => showStep(toolStep(e.run_id, e.id, e.name), e, false),
  answered: (e) => {
    const runId = requestCards.get(e.request_id)?.dataset.run;
    removeRequest(e.request_id);
    if (runId && e.ok === false) updateRun({ id: runId, declined: true });
  },
  done: (e) => {
    updateRun({ id: e.run_id, status: e.status, text: e.text, declined: e.declined });
    // Should an event ever come without the text, the run itself has it.
    if (typeof e.text !== "string") {
      getJSON(`/runs/${encodeURIComponent(e.run_id)}`).then(updateRun, () => {});
    }
  },
  error: (e) => updateRun({ id: e.run_id, status: "error", error: e.message }),
};

function connect() {
  if (loggedOut && logoutButton.disabled) return; // logged out here: only the address logs in
  const source = new EventSource("/events");
  eventSource = source;
  source.addEventListener("open", () => {
    loggedOut = false;
    connection.textContent = "Live";
    connection.dataset.state = "live";
    // Whatever happened while we were not listening (the first load included) is caught
    // up here; showing a request or a run twice is harmless, they are keyed by id.
    resync();
  });
  source.addEventListener("error", (event) => {
    if (typeof event.data === "string") return; // the server's own "error" event, handled below
    connection.dataset.state = "down";
    if (source.readyState === EventSource.CLOSED) {
      // The browser gives up after an HTTP error reply (a 401 too): retry ourselves, gently.
      if (!loggedOut) connection.textContent = "Disconnected; retrying in 5 s…";
      setTimeout(connect, 5000);
    } else if (!loggedOut) {
      connection.textContent = "Reconnecting…";
    }
  });
  for (const [name, handle] of Object.entries(HANDLERS)) {
    source.addEventListener(name, (event) => {
      // "error" is also the name of the connection-failure event, which carries no data.
      if (typeof event.data !== "string") return;
      let payload;
      try {
        payload = JSON.parse(event.data);
      } catch {
        console.warn("ignoring a malformed event", name, event.data);
        return;
      }
      handle(payload);
    });
  }
}

// Logging out ends the session on the server too, so a copy of the cookie that another
// server on this host received stops working as well.
logoutButton.addEventListener("click", async () => {
  logoutButton.disabled = true;
  try {
    const response = await fetch("/logout", { method: "POST" });
    if (response.ok || response.status === 401) {
      eventSource?.close();
      noteStatus(401);
      return;
    }
  } catch {
    // Not reached: still logged in, so the button stays.
  }
  logoutButton.disabled = false;
});

startForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const errorBox = startForm.querySelector(".error");
  const button = startForm.querySelector("button[type=submit]");
  // An empty box starts the example it shows: a newcomer's first click just works.
  const prompt = promptBox.value.trim() || promptBox.placeholder.trim();
  if (!prompt) {
    showError(errorBox, "Please write a prompt first.");
    return;
  }
  button.disabled = true;
  showError(errorBox, "");
  try {
    const result = await postJSON("/runs", { prompt });
    if (result.ok && result.payload && typeof result.payload.id === "string") {
      // The run_started event may have beaten this reply: only fill in what is missing.
      updateRun({ id: result.payload.id, prompt }, { status: result.payload.status || "running" });
      promptBox.value = "";
    } else {
      showError(errorBox, `Could not start the run: ${errorText(result)}`);
    }
  } catch (err) {
    showError(errorBox, `Could not reach the server: ${err.message}`);
  } finally {
    button.disabled = false;
  }
});

// Ctrl+Enter (Cmd+Enter) starts the run from the prompt box.
promptBox.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) startForm.requestSubmit();
});

// Load straight away, so the page fills even before (or without) a live stream.
resync();
connect();
