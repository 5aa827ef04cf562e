// The inbox page: start runs, answer what they ask, watch them finish.
//
// Plain JavaScript modules, no framework and no build step. The two lists (what waits for
// an answer, and the runs) are pages of the API's paged listings (`limit` and the opaque
// `next` cursor), filtered and searched by the server, with its counts; "Show more" fetches
// the next page. The event stream keeps what is shown up to date; a reconnect resumes it
// with Last-Event-ID (the browser sends it), so nothing is fetched again unless the server
// says so (a `snapshot` event) or the stream had to start over; the first page of requests
// is read again on a resumed reconnect too, for the inline questions the stream does not
// replay.
import { LOGGED_OUT, auth, getJSON, noteStatus, onLoggedOut, postJSON, query, errorText, sendAnswer } from "./api.js";
import { buildRequestCard, cardHooks, dropCard, knowRunPrompt } from "./cards.js";
import { debounce, el } from "./dom.js";
import {
  FINAL,
  detailHooks,
  dropRun,
  openRun,
  runChanged,
  runs,
  showStep,
  toolStep,
  updateRun,
} from "./runs.js";

const connection = document.getElementById("connection");
const logoutButton = document.getElementById("logout");
const startForm = document.getElementById("start-form");
const promptBox = document.getElementById("prompt");
const banner = document.getElementById("logged-out");

// Items per page: enough to fill a screen many times over, few enough to draw at once.
const PAGE = 100;
const KIND_LABELS = { approval: "Approvals", question: "Questions", authorization: "Logins", input: "Forms" };
const STATUS_LABELS = { pending: "waiting" };

const answered = new Set(); // so a page fetch that raced an answer cannot bring a card back

/**
 * One paged list: the items of the current filters, in the server's order, fetched a page
 * at a time. `matches` tells whether an item that arrives by an event belongs to it.
 */
class Pager {
  constructor({ name, path, itemsKey, render, drop, matches, update = null }) {
    Object.assign(this, { name, path, itemsKey, render, drop, matches, update });
    this.list = document.getElementById(`${name}`);
    this.more = document.getElementById(`${name}-more`);
    this.summary = document.getElementById(`${name}-summary`);
    this.chips = document.getElementById(`${name}-chips`);
    this.empty = document.getElementById(`${name}-empty`);
    this.nodes = new Map(); // id -> element, in list order
    this.filters = {};
    this.next = null;
    this.total = 0;
    this.counts = {};
    this.generation = 0;
    this.more.addEventListener("click", () => this.loadMore());
    this.refreshCounts = debounce(() => this.fetchCounts(), 400);
  }

  params(extra = {}) {
    return query({ ...this.filters, ...extra });
  }

  /** The first page of the current filters; what was shown and is still listed is kept. */
  async reload() {
    const generation = ++this.generation;
    const asked = performance.now();
    this.list.setAttribute("aria-busy", "true");
    try {
      const page = await getJSON(`${this.path}${this.params({ limit: PAGE })}`);
      if (generation !== this.generation) return; // a newer filter won the race
      this.apply(page, true, asked);
    } finally {
      if (generation === this.generation) this.list.removeAttribute("aria-busy");
    }
  }

  async loadMore() {
    if (!this.next) return;
    const generation = this.generation;
    const asked = performance.now();
    this.more.disabled = true;
    try {
      const page = await getJSON(`${this.path}${this.params({ limit: PAGE, cursor: this.next })}`);
      if (generation === this.generation) this.apply(page, false, asked);
    } finally {
      this.more.disabled = false;
    }
  }

  /** Counts and total of the current filters, without fetching items again. */
  async fetchCounts() {
    if (auth.loggedOut) return;
    const generation = this.generation;
    try {
      const page = await getJSON(`${this.path}${this.params({ limit: 1 })}`);
      if (generation !== this.generation || !page.counts) return;
      this.counts = page.counts;
      this.total = typeof page.total === "number" ? page.total : this.total;
      this.draw();
    } catch {
      // The stream's error handler tells the person; the next event tries again.
    }
  }

  /** A page fetched at `asked`: what events said since then wins over it. */
  apply(page, replace, asked) {
    let items = Array.isArray(page[this.itemsKey]) ? page[this.itemsKey] : [];
    const paged = "next" in page;
    // A server without paging lists everything, unfiltered: filter and count here.
    if (!paged) items = items.filter((item) => this.matches(item));
    this.next = paged ? page.next ?? null : null;
    this.total = typeof page.total === "number" ? page.total : items.length;
    this.counts = page.counts && typeof page.counts === "object" ? page.counts : this.countOf(page);
    const keep = new Set(items.map((item) => item.id));
    if (replace) {
      for (const [id, node] of [...this.nodes]) {
        // A card an event brought after the page was asked for is newer than the page.
        if (!keep.has(id) && !(node.addedAt > asked)) this.remove(id);
      }
    }
    for (const item of items) {
      if (typeof item?.id !== "string" || answered.has(item.id)) continue;
      const kept = this.nodes.get(item.id);
      if (kept) this.update?.(item, asked);
      const node = kept ?? this.render(item, asked);
      if (!node) continue;
      this.nodes.set(item.id, node);
      this.list.append(node); // moves a kept one: the list ends in the server's order
    }
    this.draw();
  }

  countOf(page) {
    const counts = {};
    for (const item of page[this.itemsKey] ?? []) {
      const key = this.countKey(item);
      counts[key] = (counts[key] ?? 0) + 1;
    }
    return counts;
  }

  /** The count an item belongs to (its kind or its status). */
  countKey(item) {
    return this.name === "requests" ? item.kind : item.status;
  }

  /** An item that arrived by an event: shown if it belongs here and the last page is shown.
   * The counts change at once; the server's come a moment later (refreshCounts). */
  add(item, atTop = false) {
    if (this.nodes.has(item.id)) return;
    const key = this.countKey(item);
    this.counts[key] = (this.counts[key] ?? 0) + 1;
    if (!this.matches(item)) return this.drawChips();
    this.total += 1;
    if (!atTop && this.next) return this.draw(); // it belongs on a later page
    const node = this.render(item);
    if (!node) return;
    node.addedAt = performance.now();
    this.nodes.set(item.id, node);
    if (atTop) this.list.prepend(node);
    else this.list.append(node);
    this.draw();
  }

  remove(id) {
    const node = this.nodes.get(id);
    if (!node) return false;
    this.nodes.delete(id);
    this.drop(id, node);
    return true;
  }

  draw() {
    this.empty.hidden = this.nodes.size > 0;
    const shown = this.nodes.size;
    this.summary.textContent =
      this.total > shown ? `Showing ${shown.toLocaleString()} of ${this.total.toLocaleString()}` : "";
    this.more.hidden = !this.next;
    const left = Math.max(this.total - shown, 0).toLocaleString();
    this.more.textContent = `Show more ${this.name} (${left} more)`;
    this.drawChips();
  }

  drawChips() {
    const key = this.name === "requests" ? "kind" : "status";
    const labels = this.name === "requests" ? KIND_LABELS : STATUS_LABELS;
    const all = Object.values(this.counts).reduce((a, b) => a + (Number(b) || 0), 0);
    const chip = (value, label, count) => {
      const pressed = (this.filters[key] ?? null) === value;
      const button = el("button", {
        type: "button",
        class: "chip",
        "aria-pressed": String(pressed),
        "data-value": value ?? "",
      });
      button.append(el("span", { class: "chip-label", text: label }), " ", el("span", { class: "count", text: Number(count).toLocaleString() }));
      button.addEventListener("click", () => this.setFilter(key, pressed ? null : value));
      return button;
    };
    const names = Object.keys(this.counts).sort();
    this.chips.replaceChildren(
      chip(null, "All", all),
      ...names.map((name) => chip(name, labels[name] ?? name, this.counts[name])),
    );
  }

  setFilter(key, value) {
    if (value === null || value === undefined || value === "") delete this.filters[key];
    else this.filters[key] = value;
    this.drawChips();
    return this.reload().catch(showLoadError);
  }
}

// ---- the two lists ----

function matchesQuery(text, q) {
  return !q || String(text ?? "").toLowerCase().includes(q.toLowerCase());
}

const requests = new Pager({
  name: "requests",
  path: "/requests",
  itemsKey: "requests",
  render: (request) => buildRequestCard(request),
  drop: (id, card) => {
    dropCard(card);
    card.remove();
    selection.delete(id);
    drawSelection();
  },
  matches: (r) =>
    (!requests.filters.kind || r.kind === requests.filters.kind) &&
    (!requests.filters.run || r.run_id === requests.filters.run) &&
    matchesQuery(r.prompt, requests.filters.q),
});

const runList = new Pager({
  name: "runs",
  path: "/runs",
  itemsKey: "runs",
  render: (run, asked) => updateRun(run, true, asked ?? performance.now())?.li,
  update: (run, asked) => updateRun(run, false, asked),
  drop: (id) => dropRun(id),
  matches: (run) =>
    (!runList.filters.status || run.status === runList.filters.status) &&
    matchesQuery(run.prompt, runList.filters.q),
});

function showLoadError(err) {
  if (!auth.loggedOut) connection.textContent = `Could not load: ${err.message}`;
}

/** The first page of both lists, with their filters (at start, and when the stream restarts). */
function resync() {
  return Promise.all([requests.reload(), runList.reload()]).catch(showLoadError);
}

// ---- a card answered, or gone ----

function requestGone(id) {
  answered.add(id);
  const card = requests.nodes.get(id);
  if (!card) return null;
  const runId = card.dataset.run;
  const kind = card.dataset.kind;
  requests.remove(id);
  requests.total = Math.max(requests.total - 1, 0);
  if (requests.counts[kind] > 0) requests.counts[kind] -= 1;
  requests.draw();
  return runId;
}

cardHooks.answered = (request, body) => {
  requestGone(request.id);
  if (body && body.ok === false && request.run_id) updateRun({ id: request.run_id, declined: true });
  requests.refreshCounts();
};
cardHooks.openRun = (runId) => openRun(runId);
cardHooks.selected = (card) => {
  const id = card.dataset.request;
  if (card.querySelector(".select").checked) selection.add(id);
  else selection.delete(id);
  drawSelection();
};
detailHooks.showRequests = (runId) => {
  runFilter(runId);
};

function runFilter(runId) {
  const chip = document.getElementById("requests-run");
  chip.hidden = !runId;
  chip.querySelector(".run-id").textContent = runId ?? "";
  requests.setFilter("run", runId);
}
document.getElementById("requests-run-clear").addEventListener("click", () => runFilter(null));

// ---- search ----

for (const [pager, id] of [
  [requests, "requests-search"],
  [runList, "runs-search"],
]) {
  const box = document.getElementById(id);
  const search = debounce(() => pager.setFilter("q", box.value.trim()), 250);
  box.addEventListener("input", search);
  box.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && box.value) {
      box.value = "";
      pager.setFilter("q", "");
    }
  });
}

// ---- acting on several requests at once: declining is safe, approving stays one by one ----

const selection = new Set();
const bulk = document.getElementById("bulk");
const bulkCount = document.getElementById("bulk-count");
const bulkDecline = document.getElementById("bulk-decline");
const bulkConfirm = document.getElementById("bulk-confirm");
const bulkStatus = document.getElementById("bulk-status");

function drawSelection() {
  bulk.hidden = selection.size === 0 && !bulkStatus.textContent;
  bulkCount.textContent = `${selection.size.toLocaleString()} selected`;
  bulkDecline.textContent = `Decline selected (${selection.size.toLocaleString()})`;
  bulkDecline.disabled = selection.size === 0;
  bulkConfirm.hidden = true;
}

function select(card, on) {
  const box = card.querySelector(".select");
  if (!box || box.disabled || box.checked === on) return;
  box.checked = on;
  cardHooks.selected(card);
}

document.getElementById("select-all").addEventListener("click", () => {
  for (const card of requests.nodes.values()) select(card, true);
});
document.getElementById("select-none").addEventListener("click", () => {
  for (const card of requests.nodes.values()) select(card, false);
});
bulkDecline.addEventListener("click", () => {
  bulkConfirm.hidden = false;
  document.getElementById("bulk-question").textContent =
    `Decline ${selection.size.toLocaleString()} requests? Their runs go on without what they asked for.`;
  document.getElementById("bulk-yes").focus();
});
document.getElementById("bulk-no").addEventListener("click", () => {
  bulkConfirm.hidden = true;
});
document.getElementById("bulk-yes").addEventListener("click", async () => {
  bulkConfirm.hidden = true;
  const ids = [...selection];
  let done = 0;
  const failed = [];
  bulkStatus.textContent = `Declining ${ids.length.toLocaleString()}…`;
  const worker = async () => {
    while (ids.length && !auth.loggedOut) {
      const id = ids.shift();
      const card = requests.nodes.get(id);
      let result;
      try {
        result = await sendAnswer(id, { ok: false, reason: "declined" });
      } catch (err) {
        failed.push(err.message);
        continue;
      }
      if (result.ok || result.status === 404 || result.status === 409) {
        // Taken, or no longer answerable by anyone: either way it leaves the inbox.
        if (result.ok) done += 1;
        else failed.push(errorText(result));
        requestGone(id);
        const runId = card?.dataset.run;
        if (result.ok && runId) updateRun({ id: runId, declined: true });
      } else failed.push(errorText(result));
    }
  };
  // A few at a time: the server takes each answer in its own transaction.
  await Promise.all(Array.from({ length: 6 }, worker));
  bulkStatus.textContent =
    `Declined ${done.toLocaleString()}.` +
    (failed.length ? ` ${failed.length} could not be: ${failed[0]}` : "");
  requests.refreshCounts();
  drawSelection();
});

// ---- keyboard ----

function cardsOf(list) {
  return [...list.children].filter((node) => node.matches(".card"));
}

async function moveFocus(step) {
  const active = document.activeElement?.closest?.(".card");
  const list = active?.parentElement === runList.list ? runList : requests;
  let cards = cardsOf(list.list);
  let index = active ? cards.indexOf(active) + step : 0;
  if (index >= cards.length && list.next) {
    await list.loadMore();
    cards = cardsOf(list.list);
  }
  index = Math.min(Math.max(index, 0), cards.length - 1);
  const card = cards[index];
  if (!card) return;
  card.focus();
  card.scrollIntoView({ block: "nearest" });
}

document.addEventListener("keydown", (event) => {
  if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented) return;
  const target = event.target;
  if (target.closest?.("input, textarea, select, [contenteditable], dialog")) return;
  const card = target.closest?.(".card.request, .card.run");
  const keys = {
    j: () => moveFocus(1),
    k: () => moveFocus(-1),
    "/": () => document.getElementById("requests-search").focus(),
    x: () => card?.matches(".request") && select(card, !card.querySelector(".select").checked),
    o: () => card && openRun(card.dataset.run),
    Enter: () => card === target && openRun(card.dataset.run),
  };
  const action = keys[event.key];
  if (!action) return;
  if (event.key === "Enter" && card !== target) return; // Enter on a button is the button's
  event.preventDefault();
  action();
});

// ---- the live event stream ----

function runStatus(id, status, extra = {}) {
  const run = { id, status, ...extra };
  updateRun(run);
  runChanged(id);
  runList.refreshCounts();
}

const HANDLERS = {
  run_started: (e) => {
    knowRunPrompt(e.run_id, e.prompt);
    runList.add({ id: e.run_id, prompt: e.prompt, status: "running" }, true);
    runList.refreshCounts();
  },
  pending: (e) => {
    const request = { run_id: e.run_id, ...e.request };
    if (typeof request.id !== "string" || answered.has(request.id)) return;
    requests.add(request);
    requests.refreshCounts();
    // An inline question (durable: false) waits inside a tool call: the store, which says
    // what a run's status is, still has the run running.
    if (request.durable !== false && e.run_id) runStatus(e.run_id, "pending");
  },
  tool_call: (e) => {
    showStep(toolStep(e.run_id, e.id, e.name), { arguments: e.arguments }, false);
    runChanged(e.run_id);
  },
  tool_result: (e) => {
    showStep(toolStep(e.run_id, e.id, e.name), e, false);
    runChanged(e.run_id);
  },
  answered: (e) => {
    const runId = requestGone(e.request_id) ?? e.run_id;
    requests.refreshCounts();
    if (!runId) return;
    if (e.ok === false) updateRun({ id: runId, declined: true });
    const entry = runs.get(runId);
    const stillWaiting = [...requests.nodes.values()].some((c) => c.dataset.run === runId);
    if (entry && !stillWaiting && entry.data.status === "pending") runStatus(runId, "running");
    runChanged(runId);
  },
  done: (e) => runStatus(e.run_id, e.status, { text: e.text, declined: e.declined }),
  failed: (e) => runStatus(e.run_id, "error", { error: e.message ?? e.error }),
  error: (e) => runStatus(e.run_id, "error", { error: e.message }),
  // The server cannot replay what this page missed: start the lists over.
  snapshot: () => resync(),
};

let eventSource = null;
let retryTimer = null;

function connect() {
  if (auth.loggedOut) return; // only the printed address logs in again
  const source = new EventSource("/events");
  eventSource = source;
  let opened = 0;
  let resumable = false; // the server numbers its events: a reconnect resumes from the last
  source.addEventListener("open", () => {
    opened += 1;
    connection.textContent = "Live";
    connection.dataset.state = "live";
    // What happened before this stream opened (since the first fetch, or while a stream
    // that had to start over was down) is caught up with the first pages, nothing more; a
    // reconnect that resumes from the last event id needs nothing.
    if (opened === 1 || !resumable) resync();
    // The inline questions of MCP servers have no place in the store's sequence, so a
    // resumed stream does not replay them: the first page of requests lists them.
    else requests.reload().catch(showLoadError);
  });
  source.addEventListener("error", (event) => {
    if (typeof event.data === "string") return; // the server's own "error" event
    connection.dataset.state = "down";
    if (!auth.loggedOut) connection.textContent = "Reconnecting…";
    // EventSource never shows the reply's status: ask an API call whether this is a
    // lost login (401) or a lost connection.
    getJSON("/runs?limit=1").then(
      () => {
        if (source.readyState === EventSource.CLOSED) reconnectSoon(1000);
      },
      () => {
        if (auth.loggedOut) return;
        if (source.readyState === EventSource.CLOSED) {
          connection.textContent = "Disconnected; retrying in 5 s…";
          reconnectSoon(5000);
        }
      },
    );
  });
  for (const [name, handle] of Object.entries(HANDLERS)) {
    source.addEventListener(name, (event) => {
      // "error" is also the name of the connection-failure event, which carries no data.
      if (typeof event.data !== "string") return;
      if (event.lastEventId) resumable = true;
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
  return source;
}

function reconnectSoon(ms) {
  eventSource?.close();
  clearTimeout(retryTimer);
  retryTimer = setTimeout(connect, ms);
}

onLoggedOut(() => {
  eventSource?.close();
  clearTimeout(retryTimer);
  connection.textContent = LOGGED_OUT;
  connection.dataset.state = "down";
  banner.hidden = false;
  document.body.dataset.auth = "out";
});

// Logging out ends the session on the server too, so a copy of the cookie that another
// server on this host received stops working as well.
logoutButton.addEventListener("click", async () => {
  logoutButton.disabled = true;
  try {
    const response = await fetch("/logout", { method: "POST" });
    if (response.ok || response.status === 401) {
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
  const fail = (message) => {
    errorBox.textContent = message;
    errorBox.hidden = !message;
  };
  // An empty box starts the example it shows: a newcomer's first click just works.
  const prompt = promptBox.value.trim() || promptBox.placeholder.trim();
  if (!prompt) return fail("Please write a prompt first.");
  button.disabled = true;
  fail("");
  try {
    const result = await postJSON("/runs", { prompt });
    if (result.ok && result.payload && typeof result.payload.id === "string") {
      // The run_started event may have beaten this reply: only fill in what is missing.
      const status = result.payload.status || "running";
      runList.add({ id: result.payload.id, prompt, status }, true);
      if (!FINAL.has(status)) knowRunPrompt(result.payload.id, prompt);
      promptBox.value = "";
    } else {
      const wait = result.status === 429 ? " The server runs as many as it may; try again shortly." : "";
      fail(`Could not start the run: ${errorText(result)}${wait}`);
    }
  } catch (err) {
    fail(`Could not reach the server: ${err.message}`);
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
