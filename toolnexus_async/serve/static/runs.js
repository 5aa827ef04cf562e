// Runs: a card per run in the list (status, prompt, steps, final text), and a run's detail
// view with its whole history: every step with its arguments (and the changed ones), the
// request it raised and the answer it got (who gave it, when, through which worker), and its
// output; and the answers the server refused, from the run's audit trail.
// Every text here goes through the display rules (display.js).
import { ASKED, auth, getRun } from "./api.js";
import { knowRunPrompt } from "./cards.js";
import { cutText, debounce, el, labelOf, timeText } from "./dom.js";
import {
  escapeLines,
  shownJSON,
  shownLines,
  shownText,
  shownValue,
  valueText,
  warningLine,
} from "./display.js";

export const FINAL = new Set(["done", "incomplete", "error", "failed"]);
const STATUS_LABELS = { pending: "waiting for an answer" };
// Characters of a step's output shown in the list; the detail view shows all of it.
const OUTPUT_IN_LIST = 160;
// Characters of a step's output shown in the detail view before "Show all".
const OUTPUT_IN_DETAIL = 4000;
// What a run's card in the list shows of its prompt and final text (the detail view shows
// all): a prompt of 10,000 characters, or of a thousand lines, must not fill the page.
const PROMPT_IN_LIST = 280;
const TEXT_IN_LIST = 1000;
const LINES_IN_LIST = 8;

export const runs = new Map(); // run id -> {li, data, steps: Map(call id -> <li>), ...}

/** The card of a run, made (not yet placed in a list) if it is new. */
export function runEntry(id) {
  let entry = runs.get(id);
  if (entry) return entry;
  const li = el("li", { class: "card run", tabindex: "-1", "data-run": id });
  const details = el("button", { type: "button", class: "link", title: "Open the run (o)" });
  details.textContent = "Details";
  details.addEventListener("click", () => openRun(id));
  entry = {
    li,
    data: { id },
    steps: new Map(),
    status: el("span", { class: "status" }),
    prompt: el("span", { class: "prompt" }),
    warning: el("span", { class: "run-warning-slot" }),
    stepList: el("ol", { class: "steps" }),
    text: el("div", { class: "result", hidden: true }),
    error: el("div", { class: "error", hidden: true }),
    stepsLoaded: false,
  };
  li.append(
    el("div", { class: "run-head" }, entry.status, entry.prompt),
    entry.warning,
    entry.stepList,
    entry.text,
    entry.error,
    el("p", { class: "meta" }, `run ${id} · `, details),
  );
  runs.set(id, entry);
  stepsWhenSeen.observe(li);
  return entry;
}

/** A run card leaves the list. */
export function dropRun(id) {
  const entry = runs.get(id);
  if (!entry) return;
  stepsWhenSeen.unobserve(entry.li);
  entry.li.remove();
  runs.delete(id);
}

// When an event last told each run's status, and what it told: a run fetched before that
// is older news, and the status it shows is the event's (even on a card the event came
// too early to find: the page's first fetch of the runs races the stream's first events).
const statusAt = new Map(); // run id -> {at, status}

/**
 * Merge what is known about a run into its card, if the page shows it, and redraw it.
 * `run[ASKED]` (or `asked`) is when a fetched run was asked for: its status gives way to
 * one an event told since. Without it, the news is an event's.
 */
export function updateRun(run, create = false, asked = run?.[ASKED]) {
  if (!run || typeof run.id !== "string") return null;
  if (typeof run.prompt === "string") knowRunPrompt(run.id, run.prompt);
  const told = statusAt.get(run.id);
  const older = asked !== undefined && told !== undefined && told.at > asked;
  if (asked === undefined && run.status) {
    statusAt.set(run.id, { at: performance.now(), status: run.status });
  }
  if (!create && !runs.has(run.id)) return null;
  const entry = runEntry(run.id);
  const data = entry.data;
  for (const [key, given] of Object.entries(run)) {
    const value = key === "status" && older ? told.status : given;
    if (value === undefined || value === null || key === "steps") continue;
    // A stale snapshot (a re-sync racing "done") must not un-finish a run.
    if (key === "status" && FINAL.has(data.status) && !FINAL.has(value)) continue;
    // Once a request of the run was declined, it stays so.
    if (key === "declined") data.declined = data.declined === true || value === true;
    else data[key] = value;
  }
  // A run that ended "done" after a refusal did not do all it was asked: not a success.
  const status = data.status === "done" && data.declined ? "declined" : data.status || "running";
  entry.li.dataset.status = status;
  entry.status.textContent = STATUS_LABELS[status] || status;
  entry.prompt.replaceChildren(...shownLines(escapeLines(inList(data.prompt ?? "", PROMPT_IN_LIST)), "auto"));
  entry.text.replaceChildren(
    ...(data.text ? shownLines(escapeLines(inList(data.text, TEXT_IN_LIST)), "auto") : []),
  );
  entry.text.hidden = !data.text;
  entry.error.replaceChildren(
    ...(data.error ? shownLines(escapeLines(`Error: ${data.error}`), "auto") : []),
  );
  entry.error.hidden = !data.error;
  redrawWarning(entry);
  return entry;
}

/** `text` as a run's card in the list shows it: at most `limit` characters and
 * LINES_IN_LIST lines, with "…" where it was cut. */
function inList(text, limit) {
  const lines = String(text).split("\n");
  const few = lines.length > LINES_IN_LIST ? lines.slice(0, LINES_IN_LIST).join("\n") : String(text);
  const { text: head, cut } = cutText(few, limit);
  return cut || lines.length > LINES_IN_LIST ? `${head}…` : head;
}

function redrawWarning(entry) {
  const count = entry.li.querySelectorAll(".escape").length;
  entry.warning.replaceChildren(warningLine(count, "This run's text") ?? "");
}

/** The list item of a step of a run the page shows; null for a run it does not show. */
export function toolStep(runId, callId, name) {
  const entry = runs.get(runId);
  if (!entry) return null;
  let step = entry.steps.get(callId);
  if (!step) {
    step = el("li", {}, el("span", { class: "tool", text: name }), el("span", { class: "output" }));
    step.data = { id: callId, name };
    entry.steps.set(callId, step);
    entry.stepList.append(step);
  }
  return step;
}

/** A step's outcome in words: a refusal is "declined", never the model's own text of it;
 * an answer is its fields, never its JSON. */
export function showStep(step, facts, ended) {
  if (!step) return;
  Object.assign(step.data, facts);
  const s = step.data;
  step.dataset.error = s.is_error ? "true" : "false";
  step.dataset.declined = s.declined ? "true" : "false";
  const output = step.querySelector(".output");
  const fields = s.declined ? null : answerFields(s, true);
  if (s.declined) output.replaceChildren(" → declined");
  else if (fields) output.replaceChildren(" → ", fields);
  else if (typeof s.output === "string") {
    const { text, cut } = cutText(s.output, OUTPUT_IN_LIST);
    output.replaceChildren(" → ", shownText(cut ? `${text}…` : text, { inline: true }));
  } else output.replaceChildren(ended ? " → answered" : " …"); // no output kept (or none yet)
  const entry = runs.get(step.closest(".run")?.dataset.run);
  if (entry) redrawWarning(entry);
}

/** Rebuild a run's steps from GET /runs/{id}, in their order (after a reload or restart). */
export async function loadSteps(runId) {
  const run = await getRun(runId);
  const entry = updateRun(run);
  if (!entry || !Array.isArray(run.steps)) return;
  entry.stepsLoaded = true;
  for (const s of run.steps) {
    if (!s || typeof s.id !== "string") continue;
    const step = toolStep(runId, s.id, String(s.name ?? ""));
    const live = step.dataset.error !== undefined; // an event said more already
    if (!live || typeof s.output === "string") showStep(step, s, FINAL.has(run.status));
    entry.stepList.append(step); // moves it: the list ends in the server's order
  }
}

// A run card fetches its steps once it is on screen: a page of a hundred runs costs the
// few in view, not a hundred requests at each load.
const stepsWhenSeen = new IntersectionObserver((entries) => {
  for (const seen of entries) {
    if (!seen.isIntersecting) continue;
    stepsWhenSeen.unobserve(seen.target);
    const entry = runs.get(seen.target.dataset.run);
    if (entry && !entry.stepsLoaded && !auth.loggedOut) {
      loadSteps(entry.data.id).catch(() => {});
    }
  }
});

// ---- answers as fields ----

/**
 * What a person answered, as label and value pairs by the display rules: a question's
 * answers beside their questions, a form's values beside their labels, changed arguments
 * as their JSON. `inline` makes one line for the list; null when there is nothing to show.
 */
export function answerFields(step, inline = false) {
  const questions =
    step.request?.data?.questions ?? step.arguments?.questions ?? step.request?.questions;
  let data = step.answer?.data;
  if (!data && typeof step.output === "string" && Array.isArray(questions)) {
    // The question tool hands the model the answer's JSON: shown as what it says.
    try {
      data = JSON.parse(step.output);
    } catch {
      data = null;
    }
  }
  if (!data || typeof data !== "object" || Array.isArray(data)) return null;
  const pairs = [];
  if (Array.isArray(data.answers) && Array.isArray(questions)) {
    data.answers.forEach((given, i) => {
      const q = questions[i] ?? {};
      const label = typeof q === "string" ? q : String(q.header || q.question || `Answer ${i + 1}`);
      pairs.push([label, Array.isArray(given) ? given.map(valueText).join(", ") : given]);
    });
  } else {
    const titles = step.request?.data?.schema?.properties ?? {};
    for (const [key, value] of Object.entries(data)) {
      if (key === "digest") continue; // which call was approved: the step shows that call
      if (key === "arguments") pairs.push(["Arguments (changed)", value]);
      else pairs.push([String(titles[key]?.title || labelOf(key)), value]);
    }
  }
  if (pairs.length === 0) return null;
  if (inline) {
    const line = el("span", { class: "answer-fields" });
    pairs.forEach(([label, value], i) => {
      if (i > 0) line.append("; ");
      line.append(
        el("span", { class: "answer-label" }, shownText(label, { inline: true }), ": "),
        el("span", { class: "answer-value" }, shownText(valueText(value), { inline: true })),
      );
    });
    return line;
  }
  const list = el("dl", { class: "details answer-fields" });
  for (const [label, value] of pairs) {
    list.append(el("dt", {}, shownText(label, { inline: true })), el("dd", {}, shownValue(value)));
  }
  return list;
}

// ---- the detail view ----

const dialog = document.getElementById("run-detail");
const detailBody = document.getElementById("run-detail-body");
let detailRunId = null;
export const detailHooks = { showRequests: (_runId) => {} };

document.getElementById("run-detail-close").addEventListener("click", () => dialog.close());
dialog.addEventListener("close", () => {
  detailRunId = null;
});

/** Open the detail view of a run (and keep it up to date while it is open). */
export async function openRun(runId) {
  detailRunId = runId;
  detailBody.replaceChildren(el("p", { class: "empty", text: "Loading…" }));
  if (!dialog.open) dialog.showModal();
  await redrawDetail(runId);
}

async function redrawDetail(runId) {
  let run;
  try {
    run = await getRun(runId, true); // what the person opens now, not an older fetch
  } catch (err) {
    if (detailRunId === runId) {
      detailBody.replaceChildren(el("p", { class: "error", text: `Could not load the run: ${err.message}` }));
    }
    return;
  }
  if (detailRunId !== runId) return; // another run was opened meanwhile
  updateRun(run);
  detailBody.replaceChildren(...detailOf(run));
  const count = detailBody.querySelectorAll(".escape").length;
  const warning = warningLine(count, "This run's history");
  if (warning) detailBody.prepend(warning);
}

/** Something happened to a run: its open detail view is redrawn (once per burst). */
export const runChanged = (() => {
  const redraw = debounce(() => {
    if (detailRunId && dialog.open) redrawDetail(detailRunId);
  }, 250);
  return (runId) => {
    if (runId === detailRunId) redraw();
  };
})();

function detailOf(run) {
  const status = run.status === "done" && run.declined ? "declined" : run.status;
  const parts = [
    el(
      "div",
      { class: "run-head", "data-status": status },
      el("span", { class: "status", text: STATUS_LABELS[status] || status }),
      shownText(run.prompt ?? "", { className: "prompt" }),
    ),
  ];
  const when = [`run ${run.id}`];
  if (run.created) when.push(`started ${timeText(run.created)}`);
  if (run.updated) when.push(`last change ${timeText(run.updated)}`);
  parts.push(el("p", { class: "meta", text: when.join(" · ") }));
  const waiting = Array.isArray(run.requests) ? run.requests.length : 0;
  if (waiting > 0) {
    const show = el("button", { type: "button", class: "link" });
    show.textContent = waiting === 1 ? "Show its request" : `Show its ${waiting} requests`;
    show.addEventListener("click", () => {
      dialog.close();
      detailHooks.showRequests(run.id);
    });
    parts.push(el("p", { class: "waiting" }, `Waiting for ${waiting} answer${waiting === 1 ? "" : "s"}. `, show));
  }
  const steps = Array.isArray(run.steps) ? run.steps : [];
  const count = steps.length === 1 ? "1 step" : `${steps.length} steps`;
  parts.push(el("h3", { text: steps.length ? `History (${count})` : "No steps yet" }));
  parts.push(el("ol", { class: "history" }, ...steps.map(stepDetail)));
  const refused = Array.isArray(run.answers) ? run.answers.filter((r) => r?.outcome === "refused") : [];
  if (refused.length) {
    parts.push(el("h3", { text: `Refused answers (${refused.length})` }));
    parts.push(el("ul", { class: "refused-answers" }, ...refused.map(refusedItem)));
  }
  if (run.text) parts.push(el("h3", { text: "Final answer" }), shownText(run.text, { className: "result" }));
  if (run.error) parts.push(el("h3", { text: "Error" }), shownText(run.error, { className: "error" }));
  return parts;
}

/** One refused answer of the audit trail: why, from whom, when. */
function refusedItem(record) {
  const facts = [`${String(record.detail ?? "refused").replaceAll("_", " ")} (call ${record.call_id ?? "?"})`];
  if (record.answered_by) facts.push(`from ${record.answered_by}`);
  if (typeof record.at === "number") facts.push(`at ${timeText(record.at)}`);
  return el("li", { text: facts.join(" · ") });
}

function stepDetail(step) {
  const item = el("li", { class: "step", "data-step": step.id });
  const outcome = step.declined ? "declined" : step.is_error ? "error" : typeof step.output === "string" ? "ok" : "waiting";
  const head = [el("span", { class: "tool", text: String(step.name ?? "") })];
  if (typeof step.turn === "number") head.unshift(`turn ${step.turn} · `);
  item.append(el("div", { class: "step-head", "data-outcome": outcome }, ...head, ` · ${outcome}`));
  const facts = el("dl", { class: "details" });
  const changed = step.changed_arguments && typeof step.changed_arguments === "object";
  facts.append(
    el("dt", { text: changed ? "Arguments (the model's)" : "Arguments" }),
    el("dd", {}, shownJSON(step.arguments ?? {})),
  );
  if (changed) {
    facts.append(el("dt", { text: "Arguments (changed, what ran)" }), el("dd", { class: "changed" }, shownJSON(step.changed_arguments)));
  }
  if (step.request && typeof step.request === "object") {
    const request = step.request;
    const lines = Array.isArray(request.display?.prompt) ? request.display.prompt : escapeLines(request.prompt ?? "");
    facts.append(
      el("dt", { text: `Asked (${request.kind ?? "request"})` }),
      el("dd", { class: "shown" }, ...shownLines(lines, "auto")),
    );
  }
  if (step.answer && typeof step.answer === "object") {
    const a = step.answer;
    const verdict = a.ok ? "Answered: yes" : `Answered: no${a.reason ? ` (${a.reason})` : ""}`;
    const by = [verdict];
    const at = a.at !== undefined && a.at !== null ? `at ${timeText(a.at)}` : null;
    // Who answered is the server's word (the principal it admitted), never the answer's.
    if (a.answered_by) by.push(at ? `answered by ${a.answered_by} ${at}` : `answered by ${a.answered_by}`);
    else if (at) by.push(at);
    if (a.worker) by.push(`through ${a.worker}`);
    facts.append(el("dt", { text: "Answer" }), el("dd", { class: "answer", text: by.join(" · ") }));
  }
  const fields = step.declined ? null : answerFields(step);
  if (fields) facts.append(el("dt", { text: "Answered with" }), el("dd", {}, fields));
  // A question's output is its answer's JSON: the fields above say it, in words.
  if (typeof step.output === "string" && !(fields && isAnswerJSON(step))) {
    facts.append(el("dt", { text: "Output" }), el("dd", {}, longText(step.output)));
  }
  item.append(facts);
  return item;
}

/** Whether a step's output is just the JSON of the answer it got (the question tool's). */
function isAnswerJSON(step) {
  try {
    const given = JSON.parse(step.output);
    return !step.answer?.data || JSON.stringify(given) === JSON.stringify(step.answer.data);
  } catch {
    return false;
  }
}

/** A long text by the rules, cut with a button that shows the whole. */
function longText(text) {
  const { text: head, cut } = cutText(text, OUTPUT_IN_DETAIL);
  const box = shownText(head, { className: "output" });
  if (!cut) return box;
  const button = el("button", { type: "button", class: "show-all" });
  button.textContent = `Show all ${Array.from(text).length.toLocaleString()} characters`;
  const whole = el("div", {}, box, button);
  button.addEventListener("click", () => whole.replaceWith(shownText(text, { className: "output" })));
  return whole;
}
