// Calls to the inbox's HTTP API, and the one place that notices a 401.
//
// Any 401, from any call, means the page's session is gone (logged out, expired, or the
// server restarted with a new token): only the address the server printed logs in again,
// so the page says that, once, and stops trying.

export const LOGGED_OUT =
  "Not logged in: open the address that toolnexus-async serve printed (…/?token=…).";

const listeners = [];
export const auth = { loggedOut: false };

/** Call `fn` once the page learns it is logged out. */
export function onLoggedOut(fn) {
  listeners.push(fn);
}

/** A reply's status: a 401 turns the page logged out. */
export function noteStatus(status) {
  if (status !== 401 || auth.loggedOut) return;
  auth.loggedOut = true;
  for (const fn of listeners) fn();
}

export class HttpError extends Error {
  constructor(method, path, status, why) {
    super(`${method} ${path}: ${why ? `${why} ` : ""}(HTTP ${status})`);
    this.status = status;
  }
}

export async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  noteStatus(response.status);
  if (!response.ok) {
    let why = "";
    try {
      why = (await response.json())?.error ?? "";
    } catch {
      // A proxy's HTML error page, say: the status alone will have to do.
    }
    throw new HttpError("GET", path, response.status, typeof why === "string" ? why : "");
  }
  return response.json();
}

/** POST JSON; resolves to {ok, status, payload} for any HTTP status (errors are data here). */
export async function postJSON(path, body) {
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

export function errorText(result) {
  const why = typeof result.payload?.error === "string" ? result.payload.error : "";
  return why ? `${why} (HTTP ${result.status})` : `HTTP ${result.status}`;
}

/** A query string of the set values of `params` (arrays joined by commas). */
export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value === null || value === undefined || value === "") continue;
    if (Array.isArray(value)) {
      if (value.length) search.set(key, value.join(","));
    } else search.set(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/** The answer to a request; `{ok, status, payload}` as postJSON. */
export function sendAnswer(requestId, body) {
  return postJSON(`/requests/${encodeURIComponent(requestId)}/answer`, body);
}

// A run's detail (GET /runs/{id}) asked by several parts of the page at once is fetched once.
const runFetches = new Map();

// When the page asked for a fetched run (performance.now()): events since then are newer.
export const ASKED = Symbol("asked");

/** A run's detail; `fresh` asks again rather than share a fetch that began earlier. */
export function getRun(runId, fresh = false) {
  let promise = fresh ? null : runFetches.get(runId);
  if (!promise) {
    const asked = performance.now();
    promise = getJSON(`/runs/${encodeURIComponent(runId)}`)
      .then((run) => Object.assign(run, { [ASKED]: asked }))
      .finally(() => {
        if (runFetches.get(runId) === promise) runFetches.delete(runId);
      });
    runFetches.set(runId, promise);
  }
  return promise;
}
