// A request's card: what is asked, by the display rules, and the controls that answer it.
//
// What a request shows (its prompt, data and URL) is drawn from its `display`, the form the
// server builds (serve/_display.py); the texts the page builds itself (question options,
// form labels, the asking run's prompt) go through the same rules in display.js. A card
// answers one request: approvals are approved one by one, each on its own card.
import { auth, errorText, getRun, sendAnswer } from "./api.js";
import { cutText, el, labelOf, safeUrl, uid } from "./dom.js";
import {
  escapeLines,
  hiddenIn,
  jsonForEditing,
  shownField,
  shownJSON,
  shownLines,
  shownText,
  warningLine,
} from "./display.js";

// What the rest of the page does when a card is answered, or asks for a run's detail.
export const cardHooks = {
  answered: (_request, _body) => {},
  openRun: (_runId) => {},
  selected: (_card) => {},
};

const KIND_TITLES = {
  approval: "Approval needed",
  question: "Question",
  authorization: "Login needed",
  input: "Details needed",
};

// The prompt of each run that asks, once known; the cards showing a run's line.
const runPrompts = new Map();
const runLines = new Map(); // run id -> Set of the .run-prompt elements naming it

/** A run's prompt is known (from the runs list, an event, or its detail). */
export function knowRunPrompt(runId, prompt) {
  if (typeof runId !== "string" || typeof prompt !== "string" || runPrompts.get(runId) === prompt) {
    return;
  }
  runPrompts.set(runId, prompt);
  for (const line of runLines.get(runId) ?? []) showRunPrompt(line, runId);
}

function showRunPrompt(line, runId) {
  const prompt = runPrompts.get(runId);
  if (prompt === undefined) {
    line.replaceChildren(`run ${runId}`);
    return;
  }
  const { text, cut } = cutText(prompt, 120);
  line.replaceChildren("for “", shownText(cut ? `${text}…` : text, { inline: true }), "”");
  line.dataset.hidden = String(hiddenIn(escapeLines(text)));
  const card = line.closest(".request");
  card?.querySelector(".run-warning")?.remove();
  const warning = warningLine(Number(line.dataset.hidden), "The asking run's prompt");
  if (warning && card) {
    warning.classList.add("run-warning");
    line.closest(".meta").after(warning);
  }
}

// Cards fetch the prompt of the run that asks only once they are on screen: a thousand
// cards on a hundred runs cost the few runs in view, not a request each.
const onScreen = new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (!entry.isIntersecting) continue;
    onScreen.unobserve(entry.target);
    const runId = entry.target.dataset.run;
    if (runId && !runPrompts.has(runId) && !auth.loggedOut) {
      getRun(runId).then(
        (run) => knowRunPrompt(runId, run.prompt),
        () => {},
      );
    }
  }
});

/** A card leaves the page: it stops naming its run. */
export function dropCard(card) {
  const line = card.querySelector(".run-prompt");
  runLines.get(card.dataset.run)?.delete(line);
  onScreen.unobserve(card);
}

export function buildRequestCard(request) {
  const headingId = uid();
  const promptId = uid();
  const title = KIND_TITLES[request.kind] || `Request: ${request.kind}`;
  const card = el("li", {
    class: "card request",
    tabindex: "-1", // focusable by the keyboard navigation, not a tab stop of its own
    "data-request": request.id, // for tests and styles; set as an attribute, never parsed
    "data-kind": request.kind,
    "data-run": request.run_id,
    "aria-labelledby": headingId,
  });
  const select = el("input", {
    type: "checkbox",
    class: "select",
    "aria-label": `Select this request (${title})`,
    title: "Select (x)",
  });
  select.addEventListener("change", () => cardHooks.selected(card));
  card.append(el("div", { class: "card-head" }, select, el("h3", { id: headingId, text: title })));
  const display = displayOf(request);
  if (display.missing) {
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
  const meta = el("p", { class: "meta" });
  if (request.run_id) {
    const line = el("span", { class: "run-prompt" });
    const open = el("button", { type: "button", class: "link", title: "Its run's history (o)" });
    open.textContent = "open run";
    open.addEventListener("click", () => cardHooks.openRun(request.run_id));
    meta.append(line, " · ", open);
    if (!runLines.has(request.run_id)) runLines.set(request.run_id, new Set());
    runLines.get(request.run_id).add(line);
    queueMicrotask(() => showRunPrompt(line, request.run_id));
    onScreen.observe(card);
  }
  const expiry = expiryText(request.expiresAt);
  if (expiry) meta.append(request.run_id ? " · " : "", expiry);
  card.append(meta);
  // An MCP server's inline question lives in the call that waits for it, in this server's
  // process only: the person must know that a restart ends it.
  if (request.durable === false) {
    card.dataset.durable = "false";
    const why = "An MCP server asks this in the middle of a tool call: only this server process holds it.";
    card.append(el("p", { class: "inline-note", role: "note", title: why, text: "Ends if the server restarts" }));
  }

  const errorBox = el("p", { class: "error", role: "alert", hidden: true });
  const send = (body) => answer(request, card, errorBox, body);
  const build = BUILDERS[request.kind] || approvalControls;
  const describedBy = card.querySelector(`#${promptId}`) ? promptId : headingId;
  card.append(...build(request, send, describedBy), errorBox);
  // A question's or a form's card draws the request's data itself (by the same rules):
  // its warning counts what it shows. Any other card shows the server's display form.
  const drawn = build === questionControls || build === inputControls;
  const hidden = drawn ? card.querySelectorAll(".escape").length : display.hidden;
  card.querySelector(".card-head").after(warningLine(hidden) ?? "");
  return card;
}

function expiryText(expiresAt) {
  if (!expiresAt) return "";
  const when = new Date(expiresAt);
  return `expires ${Number.isNaN(when.getTime()) ? expiresAt : when.toLocaleTimeString()}`;
}

function showError(box, message) {
  box.textContent = message;
  box.hidden = !message;
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
    result = await sendAnswer(request.id, body);
  } catch (err) {
    showError(errorBox, `Could not reach the server: ${err.message}`);
    setBusy(card, false);
    return;
  }
  if (result.ok) {
    cardHooks.answered(request, body);
    return;
  }
  if (result.status === 404 || result.status === 409) {
    // Unknown, already answered or expired: no answer can succeed, so offer to dismiss it.
    showError(errorBox, `This request can no longer be answered: ${errorText(result)}`);
    const dismiss = actionButton("Dismiss", () => cardHooks.answered(request, null), null);
    card.append(el("div", { class: "actions" }, dismiss));
  } else {
    // 422 and friends: the answer was malformed; let the person correct it and retry.
    showError(errorBox, `The answer was not accepted: ${errorText(result)}`);
    setBusy(card, false);
  }
}

function actionButton(label, onclick, describedBy, primary = false) {
  const attrs = { type: "button", class: primary ? "primary" : null, "aria-describedby": describedBy };
  return el("button", { ...attrs, onclick }, label);
}

/** The request's display form; one that lacks it is shown as plain text, with a warning. */
function displayOf(request) {
  const display = request.display;
  if (display && Array.isArray(display.prompt) && Array.isArray(display.fields)) return display;
  // Only a server older or newer than this page sends none: the prompt alone, not trusted.
  return { hidden: 0, prompt: [[String(request.prompt ?? "")]], fields: [], missing: true };
}

function approving(data) {
  if (typeof data.digest !== "string") return { ok: true };
  return { ok: true, data: { digest: data.digest } };
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
  const actions = el(
    "div",
    { class: "actions" },
    // The approval names the digest of what this card showed: the server refuses it
    // if the request is for anything else (a stale page, a crossed answer).
    actionButton("Approve", () => send(approving(data)), promptId, true),
    actionButton("Decline", () => send({ ok: false, reason: "declined" }), promptId),
  );
  parts.push(actions);
  if (data.editable === true && data.arguments && typeof data.arguments === "object") {
    parts.push(argumentsEditor(data, send, promptId, actions));
  }
  return parts;
}

/**
 * "Edit arguments": the arguments as JSON in a text box (hidden characters written as \u
 * escapes, so the box never draws them raw), a preview of what was typed by the display
 * rules, and an approval that names the request's digest with the edited arguments.
 */
function argumentsEditor(data, send, promptId, actions) {
  const boxId = uid();
  const original = JSON.stringify(data.arguments);
  const toggle = actionButton("Edit arguments", null, promptId);
  toggle.setAttribute("aria-expanded", "false");
  actions.append(toggle);
  const box = el("textarea", {
    id: boxId,
    class: "arguments-editor",
    rows: "6",
    spellcheck: "false",
    autocomplete: "off",
  });
  box.value = jsonForEditing(data.arguments);
  const preview = el("div", { class: "preview" });
  const problem = el("p", { class: "error", role: "alert", hidden: true });
  const approve = actionButton("Approve with these arguments", null, promptId, true);
  const editor = el(
    "div",
    { class: "editor", hidden: true },
    el("label", { for: boxId, text: "Arguments (JSON)" }),
    box,
    el("p", { class: "hint", text: "What will run, by the display rules:" }),
    preview,
    problem,
    el("div", { class: "actions" }, approve),
  );
  const parse = () => {
    let value;
    try {
      value = JSON.parse(box.value);
    } catch (err) {
      return { error: `Not JSON: ${err.message}` };
    }
    if (!value || typeof value !== "object" || Array.isArray(value)) {
      return { error: "The arguments must be a JSON object ({…})." };
    }
    return { value };
  };
  const redraw = () => {
    const { value, error } = parse();
    problem.textContent = error ?? "";
    problem.hidden = !error;
    approve.disabled = Boolean(error);
    if (error) return;
    const shown = shownJSON(value);
    preview.replaceChildren(warningLine(shown.querySelectorAll(".escape").length, "This") ?? "", shown);
  };
  box.addEventListener("input", redraw);
  toggle.addEventListener("click", () => {
    editor.hidden = !editor.hidden;
    toggle.setAttribute("aria-expanded", String(!editor.hidden));
    if (!editor.hidden) {
      redraw();
      box.focus();
    }
  });
  approve.addEventListener("click", () => {
    const { value, error } = parse();
    if (error) return;
    // Unchanged arguments approve the call as shown; changed ones go with the digest of
    // the call they change, which the server checks before it takes them.
    const answerData = { digest: data.digest };
    if (JSON.stringify(value) !== original) answerData.arguments = value;
    send({ ok: true, data: answerData });
  });
  return editor;
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
    const label = el("label", { for: id }, shownText(header ? `${header}: ${text}` : text, { inline: true }));
    form.append(el("div", { class: "field" }, label, input));
    return () => input.value;
  }
  const multiple = question.multiple === true;
  const group = uid(); // one radio group per question
  const fieldset = el("fieldset", {}, el("legend", {}, shownText(header || text, { inline: true })));
  if (header) fieldset.append(el("div", { class: "hint" }, shownText(text)));
  const inputs = options.map((option) => {
    // Radios are required (one must be picked); checkboxes may all stay empty. The value
    // sent is the option exactly; what the person reads is its label by the rules.
    const type = multiple ? "checkbox" : "radio";
    const input = el("input", { type, name: group, value: option.label, required: !multiple });
    const description =
      option.description === undefined || option.description === null
        ? null
        : el("span", { class: "hint" }, " ", shownText(String(option.description), { inline: true }));
    fieldset.append(
      el("label", { class: "option" }, input, shownText(option.label, { inline: true }), description),
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
    shownText(String(prop.title || name), { inline: true }),
    isRequired ? el("span", { class: "required", "aria-hidden": "true", text: " *" }) : null,
  );
  const hint = hintId
    ? el("div", { id: hintId, class: "hint" }, shownText(String(prop.description)))
    : null;
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
  // A default in a text box is drawn raw by the browser: show it by the rules beside it
  // when it holds a character that the rules escape.
  const shownDefault = typeof initial === "string" ? shownText(initial, { inline: true }) : null;
  const flagged = shownDefault && shownDefault.querySelector(".escape");
  const note = flagged ? el("div", { class: "hint" }, "Prefilled: ", shownDefault) : null;
  form.append(el("div", { class: "field" }, label, input, note, hint));
  return read;
}

const BUILDERS = {
  approval: approvalControls,
  question: questionControls,
  authorization: authorizationControls,
  input: inputControls,
};
