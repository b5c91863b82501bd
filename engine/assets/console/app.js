// The tally operator console. Plain JavaScript, no dependencies, no build step: the
// daemon embeds this file and serves it from the admin listener. Everything shown comes
// from the admin API; record contents are always put in the page as text, never as HTML.
"use strict";

const TOKEN_KEY = "tally.adminToken";
const POLL_MS = 2000;
const DLT_EVERY = 3; // polls
const LEDGER_EVERY_MS = 60000;
const TREND_POINTS = 90;
const REQUEST_TIMEOUT_MS = 60000; // longer than any server-side bound (replays: 30 s reads, 30 s sends)
const TRANSFERS_PAGE = 50;

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  lagHistory: new Map(), // pipeline -> [total lag, ...]
  polls: 0,
  ledgerAt: 0,
  dltSources: [],
  planned: null, // what the last dry run showed, which Replay sends
  inFlight: new Set(), // panels being refreshed: a slow one is not asked again meanwhile
  dryRunGeneration: 0, // a dry run's answer counts only if nothing changed since it was asked
  lookupGeneration: 0,
  tokenConfigured: null, // whether the daemon has an admin token at all (null: unknown)
  freshAt: {}, // panel id -> when it last refreshed (ms)
  planNeedsConsent: false, // the last dry run listed records replayed before
  transfersNext: null, // where the next page of the transfer list starts
};

// ---------- small helpers ----------

function $(id) {
  return document.getElementById(id);
}

/** Creates an element; `attrs` values go through setAttribute, children are nodes or text. */
function el(tag, attrs, ...children) {
  const node = tag === "svg" || tag === "polyline" || tag === "rect"
    ? document.createElementNS("http://www.w3.org/2000/svg", tag)
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

/** A table in a box of its own that scrolls sideways when the table is wider than its card. */
function table(headers, rows) {
  return el("div", { class: "table-scroll" }, el("table", {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c)))))));
}

function fmtNum(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en");
}

function fmtAge(secs) {
  if (!secs) return "0 s";
  if (secs < 120) return `${secs.toFixed(1)} s`;
  if (secs < 7200) return `${(secs / 60).toFixed(1)} min`;
  return `${(secs / 3600).toFixed(1)} h`;
}

function fmtMoney(cents, currency) {
  const sign = cents < 0 ? "-" : "";
  const abs = Math.abs(cents);
  return `${sign}${Math.floor(abs / 100).toLocaleString("en")}.${String(abs % 100).padStart(2, "0")} ${currency}`;
}

let flashTimer = null;
function flash(message, kind) {
  const f = $("flash");
  f.textContent = message;
  f.className = kind || "info";
  f.hidden = false;
  clearTimeout(flashTimer);
  flashTimer = setTimeout(() => { f.hidden = true; }, 8000);
}

/** `text` as a sentence: a capital first letter and a full stop. */
function sentence(text) {
  const t = String(text || "").trim();
  if (!t) return "";
  const s = t[0].toUpperCase() + t.slice(1);
  return /[.!?]$/.test(s) ? s : `${s}.`;
}

/** What to say of a failed answer without a message of its own. */
function statusSentence(status, statusText) {
  const known = {
    400: "The daemon refused the request as malformed.",
    401: "This needs the admin token.",
    403: "The admin token was refused.",
    404: "The daemon does not know that address.",
    408: "The daemon gave up waiting for the request.",
    413: "The request is too large for the daemon.",
    429: "The daemon is busy: try again shortly.",
    500: "The daemon failed while answering: its log says why.",
    502: "A proxy in front of the daemon could not reach it.",
    503: "The daemon cannot serve this now: a dependency is unavailable.",
    504: "A proxy in front of the daemon gave up waiting for it.",
  };
  return known[status] || `The daemon answered ${status}${statusText ? ` ${statusText}` : ""} without saying why.`;
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(sentence(message));
    this.status = status;
    this.code = code;
  }
}

/** Calls the admin API; resolves to the JSON body, rejects with an ApiError. */
async function api(path, options = {}) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(path, {
      method: options.method || "GET",
      headers,
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
      // A hung connection must not hold a panel (or the poll) forever.
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
  } catch (e) {
    if (e && e.name === "TimeoutError") {
      throw new ApiError(0, "timeout", `The daemon did not answer within ${REQUEST_TIMEOUT_MS / 1000} s.`);
    }
    throw new ApiError(0, "unreachable", "The daemon cannot be reached: it may be down or restarting.");
  }
  let body = null;
  try {
    body = await res.json();
  } catch (_) {
    body = null;
  }
  // /readyz answers 503 with its reasons and /admin/ledger/check 409 with the failed
  // invariants: those bodies are the answer, not an error.
  if (!res.ok && !(options.accept || []).includes(res.status)) {
    // The body's own message when it has one ({"error": {"message"}}, or a bare
    // {"message"}), never the raw body or a bare status.
    const err = body && typeof body.error === "object" && body.error ? body.error : body || {};
    const message = typeof err.message === "string" && err.message.trim() ? err.message : statusSentence(res.status, res.statusText);
    throw new ApiError(res.status, err.code || `http_${res.status}`, message);
  }
  return body;
}

// ---------- token ----------

const NO_TOKEN = "No admin token is configured on this daemon, so none is accepted: set http.admin_token "
  + "(or TALLY__HTTP__ADMIN_TOKEN) and restart the daemon to enable pause, resume, replay and transfer lookups.";

function renderMode() {
  const operator = Boolean(state.token);
  const none = state.tokenConfigured === false;
  $("mode").textContent = operator ? "operator" : none ? "read-only: no admin token configured" : "read-only";
  $("mode").className = operator ? "badge ok" : none ? "badge warn" : "badge";
  $("mode").title = none && !operator ? NO_TOKEN : "";
  $("token").hidden = operator;
  $("token-save").hidden = operator;
  $("token-clear").hidden = !operator;
  for (const b of document.querySelectorAll("[data-needs-token]")) {
    b.disabled = !operator || b.dataset.blocked === "1";
    b.title = operator ? "" : "needs the admin token";
  }
}

async function useToken(event) {
  event.preventDefault();
  const candidate = $("token").value.trim();
  if (!candidate) return;
  const previous = state.token;
  state.token = candidate;
  try {
    // Checks the token only: works while the database or Kafka is down.
    await api("/admin/token");
  } catch (e) {
    state.token = previous;
    if (e.status === 401 || e.status === 403) {
      // Refused: because it is wrong, or because the daemon has none to compare with?
      await checkTokenConfigured();
      flash(state.tokenConfigured === false ? NO_TOKEN : "That token is not accepted.", "error");
    } else {
      flash(`Cannot check the token. ${e.message}`, "error");
    }
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, candidate);
  $("token").value = "";
  renderMode();
  flash("Token accepted: pause, resume, replay and transfer lookup are on.", "ok");
  route();
}

/** Asks the daemon whether it has an admin token (an open endpoint that says nothing else). */
async function checkTokenConfigured() {
  try {
    const body = await api("/admin/token/status");
    state.tokenConfigured = Boolean(body.configured);
  } catch (_) {
    state.tokenConfigured = null; // unknown: an older daemon, or down
  }
  renderMode();
}

function forgetToken() {
  state.token = "";
  invalidatePlan();
  state.lookupGeneration += 1; // a lookup still out is not shown read-only
  sessionStorage.removeItem(TOKEN_KEY);
  renderMode();
  flash("Token forgotten: the console is read-only.", "info");
  route();
}

// ---------- overview ----------

function sparkline(points) {
  const w = 160;
  const h = 32;
  const max = Math.max(1, ...points);
  const step = points.length > 1 ? w / (TREND_POINTS - 1) : 0;
  const start = w - step * (points.length - 1);
  const coords = points.map((p, i) => `${(start + i * step).toFixed(1)},${(h - 2 - (p / max) * (h - 4)).toFixed(1)}`);
  return el("svg", { class: "trend", width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img",
    "aria-label": `lag trend, last ${fmtNum(points[points.length - 1])}, max ${fmtNum(max)}` },
  el("polyline", { points: coords.join(" ") }));
}

/** One bar per interval, newest on the right; at least `capacity` slots wide. */
function bars(points, what, capacity) {
  const w = 320;
  const h = 32;
  const max = Math.max(1, ...points);
  const slot = w / Math.max(capacity, points.length);
  const start = w - slot * points.length;
  return el("svg", { class: "bars", width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img",
    "aria-label": `${what}, last ${fmtNum(points.length ? points[points.length - 1] : 0)}, max ${fmtNum(max)}` },
  points.map((p, i) => {
    const bar = p > 0 ? Math.max(1, (p / max) * (h - 2)) : 0.5;
    return el("rect", { x: (start + i * slot).toFixed(2), y: (h - bar).toFixed(2), width: Math.max(0.5, slot - 0.5).toFixed(2), height: bar.toFixed(2) });
  }));
}

function pipelineState(p) {
  const restart = p.restart || {};
  if (restart.down) return ["down, restarting", "bad"];
  if (restart.crashLooping) return ["crash-looping", "bad"];
  if (!p.assigned) return ["unassigned", "warn"];
  if (p.degraded) return ["degraded", "bad"];
  if (p.paused) return ["paused", "warn"];
  return ["running", "ok"];
}

function pipelineCard(p) {
  const totalLag = p.partitions.reduce((s, x) => s + (x.lag || 0), 0);
  const inFlight = p.partitions.reduce((s, x) => s + x.inFlight, 0);
  const history = state.lagHistory.get(p.name) || [];
  const [label, tone] = pipelineState(p);
  const action = p.paused ? "resume" : "pause";
  const button = el("button", { type: "button", class: `pipeline-${action}`, "data-needs-token": true,
    "data-pipeline": p.name, "data-action": action }, p.paused ? "Resume" : "Pause");
  button.addEventListener("click", () => pauseOrResume(p.name, action, button));
  return el("div", { class: "card pipeline", "data-name": p.name },
    el("div", { class: "title" },
      el("h3", {}, p.name),
      el("span", { class: `badge state ${tone}` }, label),
      button),
    el("div", { class: "meta" }, `group ${p.group} · topics ${p.topics.join(", ")}`),
    p.degraded ? el("div", { class: "reason" }, `waiting for a dependency: ${p.degradedReason || "?"}`) : null,
    p.restart && p.restart.restarts > 0
      ? el("div", { class: "reason restarts" },
        `restarted ${p.restart.restarts} time(s) after a crash; last: ${p.restart.lastCrash || "?"}`)
      : null,
    el("div", { class: "stats" },
      stat("lag", fmtNum(totalLag), "lag"),
      stat("in flight", fmtNum(inFlight), "in-flight"),
      stat("keys in retry", fmtNum(p.keysInRetry), "keys-in-retry"),
      stat("oldest in flight", fmtAge(p.oldestInFlightSeconds), "stuck-age"),
      stat("live workers", fmtNum(p.liveWorkers), "workers")),
    el("div", { class: "trend-row" }, sparkline(history), el("span", { class: "label" }, "lag, last 3 minutes")),
    el("details", {},
      el("summary", {}, `${p.partitions.length} partition(s)`),
      table(["topic", "partition", "committed", "stored", "lag", "in flight", "held"],
        p.partitions.map((x) => [x.topic, x.partition, fmtNum(x.committedOffset), fmtNum(x.storedOffset),
          fmtNum(x.lag), fmtNum(x.inFlight), x.held ? "held" : ""]))));
}

function stat(label, value, key) {
  return el("div", { class: "stat", "data-stat": key }, el("span", { class: "value" }, value), el("span", { class: "label" }, label));
}

async function pauseOrResume(name, action, button) {
  button.disabled = true;
  try {
    await api(`/admin/pipelines/${encodeURIComponent(name)}/${action}`, { method: "POST" });
    flash(`Pipeline ${name} ${action === "pause" ? "paused" : "resumed"}.`, "ok");
  } catch (e) {
    flash(`Cannot ${action} ${name}. ${e.message}`, "error");
  }
  await once("pipelines", refreshers().pipelines).catch(() => {});
}

async function refreshPipelines() {
  const body = await api("/admin/pipelines");
  for (const p of body.pipelines) {
    const h = state.lagHistory.get(p.name) || [];
    h.push(p.partitions.reduce((s, x) => s + (x.lag || 0), 0));
    while (h.length > TREND_POINTS) h.shift();
    state.lagHistory.set(p.name, h);
  }
  // Re-rendered on every poll: keep the partition lists the operator opened.
  const open = new Set([...document.querySelectorAll(".pipeline details[open]")].map((d) => d.closest(".pipeline").dataset.name));
  fill($("pipelines"), body.pipelines.map(pipelineCard));
  for (const d of document.querySelectorAll(".pipeline details")) {
    if (open.has(d.closest(".pipeline").dataset.name)) d.open = true;
  }
  renderMode();
}

async function refreshReadiness() {
  const body = await api("/readyz", { accept: [503] });
  const ready = body && body.status === "ready";
  fill($("readiness").querySelector(".body"),
    el("span", { class: `badge ${ready ? "ok" : "bad"}`, id: "ready-state" }, ready ? "ready" : "not ready"),
    ready ? null : el("ul", {}, (body.reasons || []).map((r) => el("li", {}, r))));
}

async function refreshOutbox() {
  const body = await api("/admin/outbox");
  fill($("outbox").querySelector(".body"),
    el("div", { class: "stats" },
      stat("pending", fmtNum(body.pending), "outbox-pending"),
      stat("oldest pending", fmtAge(body.oldestAgeSeconds), "outbox-age"),
      stat("parked (refused by the broker)", fmtNum(body.parked || 0), "outbox-parked")),
    body.topics.length ? table(["topic", "pending", "oldest"], body.topics.map((t) => [t.topic, fmtNum(t.pending), fmtAge(t.oldestAgeSeconds)])) : null,
    (body.parkedRows || []).length
      ? table(["parked row", "topic", "key", "reason", "since", "attempts", "held behind"],
        body.parkedRows.map((r) => [r.id, r.topic, r.key, r.reason, r.since, fmtNum(r.attempts), fmtNum(r.held)]))
      : null);
}

async function refreshDltSummary() {
  const body = await api("/admin/dlt");
  state.dltSources = body.topics.map((t) => ({ value: t.topic, label: `${t.topic} (${fmtNum(t.records)})` }));
  const table_ = body.deadLetters;
  state.dltSources.push({ value: "dead_letters", label: `dead_letters table (${fmtNum(table_.notReplayed)} not replayed)` });
  fill($("dlt-summary").querySelector(".body"),
    el("div", { class: "stats" },
      stat("in DLT topics", fmtNum(body.records), "dlt-records"),
      stat("in the table, not replayed", fmtNum(table_.notReplayed), "dlt-table")),
    table(["DLT topic", "records"], body.topics.map((t) => [el("a", { href: `#/dlt/${encodeURIComponent(t.topic)}` }, t.topic), fmtNum(t.records)])));
  fillDltSelect();
}

async function refreshLedger() {
  $("ledger-run").disabled = true;
  // Counted from the start: a slow or failing check is not started again on every poll.
  state.ledgerAt = Date.now();
  try {
    const body = await api("/admin/ledger/check", { accept: [409] });
    const failed = body.invariants.filter((i) => !i.ok);
    fill($("ledger").querySelector(".body"),
      el("span", { class: `badge ${body.ok ? "ok" : "bad"}`, id: "ledger-state" }, body.ok ? "all invariants hold" : `${failed.length} invariant(s) broken`),
      el("ul", { class: "invariants" }, body.invariants.map((i) => el("li", { class: i.ok ? "ok" : "bad" }, `${i.ok ? "✓" : "✗"} ${i.name}`))),
      el("div", { class: "hint" }, `checked ${new Date(state.ledgerAt).toLocaleTimeString()}`));
  } finally {
    $("ledger-run").disabled = false;
  }
}

async function refreshThroughput() {
  const body = await api("/admin/throughput");
  const points = body.points || [];
  const minutes = Math.round((points.length * body.intervalSeconds) / 60);
  const rows = (body.series || []).map((name) => {
    const counts = points.map((p) => p.counts[name] || 0);
    const total = counts.reduce((a, b) => a + b, 0);
    const perSec = points.length ? total / (points.length * body.intervalSeconds) : 0;
    return el("div", { class: "trend-row", "data-series": name, "data-total": total, "data-intervals": counts.length },
      el("span", { class: "series" }, name),
      bars(counts, `${name} per ${body.intervalSeconds} s`, 60),
      el("span", { class: "label" }, `${fmtNum(total)} in ${minutes < 1 ? "under a minute" : `${minutes} min`} (${perSec.toFixed(1)}/s)`));
  });
  fill($("throughput").querySelector(".body"),
    rows.length ? rows : el("p", { class: "hint" }, "No whole interval yet."),
    el("div", { class: "hint" }, `records completed per pipeline, transfers accepted by the intake; kept by the daemon, ${body.intervalSeconds} s intervals`));
}

/** Runs `job` unless its previous run is still going. */
function once(name, job) {
  if (state.inFlight.has(name)) return Promise.resolve();
  state.inFlight.add(name);
  return job().finally(() => state.inFlight.delete(name));
}

// ---------- stale panels ----------

/**
 * Runs the refresh of panel `id`: on success the panel is fresh; on failure its old values
 * stay, marked in place as stale with their age and the reason (or as never loaded).
 */
async function refreshPanel(id, job) {
  try {
    await job();
    state.freshAt[id] = Date.now();
    const card = $(id);
    card.classList.remove("is-stale");
    const mark = card.querySelector(":scope > .stale");
    if (mark) mark.remove();
  } catch (e) {
    markStale(id, e);
    throw e;
  }
}

function markStale(id, error) {
  const card = $(id);
  let mark = card.querySelector(":scope > .stale");
  if (!mark) {
    mark = el("div", { class: "stale", role: "status" });
    card.querySelector(":scope > h2").after(mark);
  }
  card.classList.add("is-stale");
  mark.dataset.since = state.freshAt[id] || "";
  mark.dataset.reason = error.message;
  renderStale(mark);
}

function fmtStaleAge(ms) {
  const secs = Math.max(0, Math.floor(ms / 1000));
  if (secs < 120) return `${secs} s`;
  if (secs < 7200) return `${Math.floor(secs / 60)} min`;
  return `${Math.floor(secs / 3600)} h`;
}

function renderStale(mark) {
  const since = Number(mark.dataset.since);
  const age = since
    ? el("span", { class: "age" }, `stale: ${fmtStaleAge(Date.now() - since)} old`)
    : el("span", { class: "age" }, "not loaded");
  fill(mark, el("span", { class: "badge warn" }, age), " ", el("span", { class: "why" }, mark.dataset.reason || ""));
}

function tickStale() {
  for (const mark of document.querySelectorAll(".stale")) renderStale(mark);
}

/** One round of refreshes; the next starts POLL_MS after this one ends, never sooner. */
function refreshers() {
  return {
    pipelines: () => refreshPanel("pipelines-panel", refreshPipelines),
    readiness: () => refreshPanel("readiness", refreshReadiness),
    outbox: () => refreshPanel("outbox", refreshOutbox),
    throughput: () => refreshPanel("throughput", refreshThroughput),
    dlt: () => refreshPanel("dlt-summary", refreshDltSummary),
    ledger: () => refreshPanel("ledger", refreshLedger),
  };
}

async function poll() {
  const r = refreshers();
  const jobs = ["pipelines", "readiness", "outbox", "throughput"].map((n) => once(n, r[n]));
  // The slow panels run on their own (their `once` guard keeps them single): a DLT
  // inventory or a ledger check on a large database does not freeze the others.
  if (state.polls % DLT_EVERY === 0) once("dlt", r.dlt).catch(() => {});
  if (Date.now() - state.ledgerAt > LEDGER_EVERY_MS) once("ledger", r.ledger).catch(() => {});
  state.polls += 1;
  const results = await Promise.allSettled(jobs);
  setTimeout(poll, POLL_MS);
  const failed = results.filter((r) => r.status === "rejected");
  $("updated").textContent = failed.length
    ? `Some panels could not refresh (marked stale). ${failed[0].reason.message}`
    : `Updated ${new Date().toLocaleTimeString()}; refreshes every ${POLL_MS / 1000} s.`;
}

// ---------- dead letters ----------

function fillDltSelect() {
  const select = $("dlt-topic");
  // The source named in the address, or the one the operator chose.
  const current = state.wantedDlt || select.value;
  fill(select, state.dltSources.map((s) => el("option", { value: s.value, selected: s.value === current }, s.label)));
  syncDltInputs();
}

function optionalInt(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number.parseInt(v, 10);
}

/** The offset inputs mean nothing for the table: they are off while it is chosen. */
function syncDltInputs() {
  const isTable = $("dlt-topic").value === "dead_letters";
  for (const id of ["dlt-partition", "dlt-from", "dlt-to"]) $(id).disabled = isTable;
}

function dltSelection() {
  const source = $("dlt-topic").value;
  const key = $("dlt-key").value || undefined;
  if (source === "dead_letters") {
    return { source, body: { key } };
  }
  return { source, body: { partition: optionalInt("dlt-partition"), fromOffset: optionalInt("dlt-from"), toOffset: optionalInt("dlt-to"), key } };
}

function recordRow(r, isTable) {
  const where = isTable ? `#${r.id}` : `${r.partition}/${r.offset}`;
  const payload = r.payloadEncoding === "json" ? JSON.stringify(r.payload, null, 2) : String(r.payload);
  return el("div", { class: "record", "data-where": where },
    el("div", { class: "title" },
      el("code", {}, where),
      el("span", { class: "badge warn" }, r.dlt.exceptionKind || "?"),
      el("span", {}, `from ${r.dlt.originalTopic} ${r.dlt.originalPartition}/${r.dlt.originalOffset}`),
      el("span", {}, `key ${r.key ?? "–"}`),
      el("span", { class: "hint" }, r.timestamp || ""),
      isTable && r.replayedAt ? el("span", { class: "badge ok" }, `replayed ${r.replayedAt}`) : null,
      !isTable && r.replayedBefore
        ? el("span", { class: "badge warn replayed" }, `replayed ${r.replayedBefore.times}× (last ${r.replayedBefore.lastAt})`)
        : null),
    el("div", { class: "reason" }, `${r.dlt.exceptionMessage || ""} (after ${r.dlt.attempts ?? "?"} attempt(s))`),
    el("details", {},
      el("summary", {}, "headers and payload"),
      table(["header", "value"], r.headers.map((h) => [h.key, h.encoding === "base64" ? `base64:${h.value}` : h.value ?? "null"])),
      el("pre", { class: "payload" }, payload)));
}

async function loadDlt(event) {
  if (event) event.preventDefault();
  invalidatePlan();
  const { source, body } = dltSelection();
  if (!source) return;
  if (!state.token) {
    fill($("dlt-records"), el("p", { class: "hint" }, "Record contents need the admin token."));
    return;
  }
  const isTable = source === "dead_letters";
  try {
    let page;
    if (isTable) {
      page = await api("/admin/dlt/dead_letters?limit=100");
    } else {
      const q = new URLSearchParams({ limit: "100" });
      if (body.partition !== undefined) q.set("partition", body.partition);
      if (body.fromOffset !== undefined) q.set("offset", body.fromOffset);
      page = await api(`/admin/dlt/${encodeURIComponent(source)}?${q}`);
    }
    let records = page.records;
    if (!isTable && body.toOffset !== undefined) records = records.filter((r) => r.offset <= body.toOffset);
    if (body.key !== undefined) records = records.filter((r) => r.key === body.key);
    const more = page.next !== null && page.next !== undefined;
    fill($("dlt-records"),
      el("p", { class: "hint", id: "dlt-count" }, `${records.length} record(s) shown`),
      page.replayLog === "unavailable"
        ? el("p", { class: "error" }, "The replay log cannot be read now: records replayed before are not marked.")
        : null,
      more
        ? el("p", { class: "hint" }, "Only the first 100 records from that position were read (the key and last-offset filters apply to those): narrow the partition or offsets to see further. A dry run and a replay cover the whole selection.")
        : null,
      records.map((r) => recordRow(r, isTable)));
  } catch (e) {
    fill($("dlt-records"), el("p", { class: "error" }, e.message));
  }
}

function replayPath(source, dryRun) {
  const base = source === "dead_letters" ? "/admin/dlt/dead_letters/replay" : `/admin/dlt/${encodeURIComponent(source)}/replay`;
  return dryRun ? `${base}?dryRun=true` : base;
}

function invalidatePlan() {
  state.planned = null;
  state.planNeedsConsent = false;
  state.dryRunGeneration += 1;
  $("dlt-replay").dataset.blocked = "1";
  $("dlt-replay").disabled = true;
  $("dlt-replay").textContent = "Replay";
}

/** Replay is on after a dry run, and, when it listed records replayed before, after the consent. */
function syncReplayButton() {
  if (!state.planned) return;
  const consent = $("dlt-again");
  const blocked = state.planNeedsConsent && !(consent && consent.checked);
  $("dlt-replay").dataset.blocked = blocked ? "1" : "0";
  renderMode();
}

async function loadReplayLog() {
  if (!state.token) {
    fill($("replay-log"), el("h3", {}, "Replay log"), el("p", { class: "hint" }, "The replay log shows record keys: give the admin token first."));
    return;
  }
  const body = await api("/admin/replays?limit=20");
  fill($("replay-log"),
    el("h3", {}, "Replay log"),
    body.replays.length
      ? table(["replayed at", "from", "record", "to", "key"], body.replays.map((r) => [
        r.replayedAt, r.source, r.sourcePartition === null ? `#${r.sourceOffset}` : `${r.sourcePartition}/${r.sourceOffset}`,
        `${r.originalTopic} ${r.originalPartition}/${r.replayedOffset}`, r.key ?? "–"]))
      : el("p", { class: "hint" }, "Nothing replayed yet."));
}

/**
 * The replays that republish exactly the records a dry run listed: for the table their
 * ids; for a topic, per partition, the offset range from the first to the last listed
 * record (DLT offsets never change, so the range holds the same records later), with the
 * same key filter.
 */
function exactReplays(source, selection, records) {
  if (source === "dead_letters") {
    return [{ ids: records.map((r) => r.id) }];
  }
  const byPartition = new Map();
  for (const r of records) {
    const [lo, hi] = byPartition.get(r.partition) || [r.offset, r.offset];
    byPartition.set(r.partition, [Math.min(lo, r.offset), Math.max(hi, r.offset)]);
  }
  return [...byPartition].map(([partition, [fromOffset, toOffset]]) => ({ partition, fromOffset, toOffset, key: selection.key }));
}

async function dryRun() {
  invalidatePlan();
  const generation = state.dryRunGeneration;
  const selection = dltSelection();
  try {
    const body = await api(replayPath(selection.source, true), { method: "POST", body: selection.body });
    // The form changed (or the token went) while the dry run ran: its answer is stale.
    if (generation !== state.dryRunGeneration) return;
    const warnings = (body.keys || []).filter((k) => k.newerProcessed > 0);
    const again = body.alreadyReplayed || 0;
    const unknown = body.replayLog === "unavailable";
    const consent = again > 0 || (unknown && body.wouldReplay > 0);
    fill($("dlt-result"),
      el("p", { id: "dlt-plan" }, `A replay would republish ${body.wouldReplay} record(s) to their original topics.`),
      again > 0
        ? el("p", { class: "error", id: "dlt-already" }, `${again} of these record(s) were replayed before (see the replay log below): replaying again republishes them again.`)
        : null,
      unknown
        ? el("p", { class: "error", id: "dlt-already" }, "The replay log cannot be read now: the console cannot tell whether these records were replayed before.")
        : null,
      consent
        ? el("label", { class: "consent" }, el("input", { type: "checkbox", id: "dlt-again" }), " Replay them anyway")
        : null,
      body.scanTruncated ? el("p", { class: "error" }, "The scan for newer records was cut short: the counts below may be low.") : null,
      warnings.length
        ? el("p", { class: "error" }, `${warnings.length} key(s) already have newer processed records: replaying may apply an older state after a newer one.`)
        : null,
      body.records.length
        ? table(["record", "to", "key", "newer processed of key", "replayed before"], body.records.map((r) => [
          r.id !== undefined ? `#${r.id}` : `${r.partition}/${r.offset}`,
          `${r.originalTopic} ${r.originalPartition}/${r.originalOffset ?? "?"}`, r.key ?? "–", fmtNum(r.newerProcessedOfKey),
          r.replayedBefore ? `${r.replayedBefore.times}×, last ${r.replayedBefore.lastAt}` : ""]))
        : null);
    if (body.wouldReplay > 0) {
      state.planned = { source: selection.source, count: body.wouldReplay, bodies: exactReplays(selection.source, selection.body, body.records) };
      state.planNeedsConsent = consent;
      $("dlt-replay").textContent = again > 0 ? `Replay ${body.wouldReplay} record(s) again` : `Replay ${body.wouldReplay} record(s)`;
      if (consent) $("dlt-again").addEventListener("change", syncReplayButton);
      syncReplayButton();
    }
  } catch (e) {
    if (generation !== state.dryRunGeneration) return;
    fill($("dlt-result"), el("p", { class: "error" }, `Dry run failed. ${e.message}`));
  }
}

async function replay() {
  const planned = state.planned;
  if (!planned) return;
  invalidatePlan();
  let replayed = 0;
  $("dlt-dry-run").dataset.blocked = "1";
  renderMode();
  let unlogged = false;
  try {
    for (const body of planned.bodies) {
      const answer = await api(replayPath(planned.source, false), { method: "POST", body });
      replayed += answer.replayed;
      unlogged = unlogged || answer.logged === false;
    }
    fill($("dlt-result"), el("p", { id: "dlt-replayed", class: "ok" }, `Replayed ${replayed} record(s).`),
      unlogged ? el("p", { class: "error" }, "The replay log could not be written: a later dry run will not warn about these records.") : null);
    flash(`Replayed ${replayed} record(s).`, "ok");
  } catch (e) {
    fill($("dlt-result"), el("p", { class: "error" }, `Replay failed after ${replayed} record(s). ${e.message}`));
  }
  $("dlt-dry-run").dataset.blocked = "0";
  renderMode();
  await Promise.allSettled([once("dlt", refreshers().dlt), loadDlt(), loadReplayLog()]);
}

// ---------- transfers ----------

async function lookupTransfer(event) {
  if (event) event.preventDefault();
  const id = $("transfer-id").value.trim();
  if (!id) return;
  if (location.hash !== `#/transfer/${id}`) history.replaceState(null, "", `#/transfer/${id}`);
  for (const n of ["transfer-summary", "transfer-postings", "transfer-timeline"]) fill($(n));
  state.lookupGeneration += 1;
  const generation = state.lookupGeneration;
  if (!state.token) {
    fill($("transfer-summary"), el("p", { class: "hint" }, "A transfer shows accounts and amounts: give the admin token first."));
    return;
  }
  let body;
  try {
    body = await api(`/admin/transfers/${encodeURIComponent(id)}`);
  } catch (e) {
    if (generation === state.lookupGeneration) fill($("transfer-summary"), el("p", { class: "error", id: "transfer-error" }, e.message));
    return;
  }
  // A later lookup was asked meanwhile: show that one.
  if (generation !== state.lookupGeneration) return;
  const t = body.transfer;
  const d = body.decision;
  fill($("transfer-summary"),
    el("dl", { class: "facts" },
      el("dt", {}, "status"), el("dd", { id: "transfer-status" }, el("span", { class: `badge ${t.status === "SETTLED" ? "ok" : t.status === "PENDING" ? "warn" : "bad"}` }, t.status)),
      el("dt", {}, "amount"), el("dd", {}, fmtMoney(t.amountCents, t.currency)),
      el("dt", {}, "from"), el("dd", {}, t.sourceAccount),
      el("dt", {}, "to"), el("dd", {}, t.destinationAccount),
      t.rejectionReason ? [el("dt", {}, "rejected because"), el("dd", {}, t.rejectionReason)] : null,
      el("dt", {}, "antifraud"), el("dd", { id: "transfer-decision" }, d ? `${d.outcome}, score ${d.score}${d.reason ? ` (${d.reason})` : ""}` : "not decided yet"),
      el("dt", {}, "accepted"), el("dd", {}, t.createdAt)),
    t.status === "PENDING"
      ? el("p", { class: "hint" }, `Not final yet. If it stays so, a record of it may be in a DLT topic: look under key ${t.sourceAccount} in Dead letters.`)
      : null);
  fill($("transfer-postings"),
    el("h3", {}, "Postings"),
    body.postings.length
      ? table(["account", "side", "amount", "at"], body.postings.map((p) => [p.accountId, p.kind, fmtMoney(p.amountCents, t.currency), p.createdAt]))
      : el("p", { class: "hint" }, "No postings (not settled, or rejected)."));
  const first = body.timeline.length ? Date.parse(body.timeline[0].at) : 0;
  fill($("transfer-timeline"),
    el("h3", {}, "Timeline"),
    table(["at", "+ms", "stage", "topic", "what"], body.timeline.map((s) => [
      s.at, `+${Date.parse(s.at) - first}`, s.stage, s.topic || "", s.what])));
}

function statusBadge(status) {
  return el("span", { class: `badge ${status === "SETTLED" ? "ok" : status === "PENDING" ? "warn" : "bad"}` }, status);
}

/** The transfer list: newest first, by account and status; `more` appends the next page. */
async function searchTransfers(event, more = false) {
  if (event) event.preventDefault();
  if (!state.token) {
    fill($("transfers-list"), el("p", { class: "hint" }, "The transfer list shows accounts and amounts: give the admin token first."));
    return;
  }
  const q = new URLSearchParams({ limit: String(TRANSFERS_PAGE) });
  const account = $("transfers-account").value.trim();
  const status = $("transfers-status").value;
  if (account) q.set("account", account);
  if (status) q.set("status", status);
  if (more && state.transfersNext) q.set("before", state.transfersNext);
  let body;
  try {
    body = await api(`/admin/transfers?${q}`);
  } catch (e) {
    fill($("transfers-list"), el("p", { class: "error", id: "transfers-error" }, e.message));
    return;
  }
  state.transfersNext = body.next;
  const rows = body.transfers.map((t) => el("tr", { "data-id": t.id },
    el("td", {}, el("a", { href: `#/transfer/${t.id}` }, el("code", {}, t.id))),
    el("td", {}, statusBadge(t.status)),
    el("td", {}, fmtMoney(t.amountCents, t.currency)),
    el("td", {}, t.sourceAccount), el("td", {}, t.destinationAccount), el("td", {}, t.createdAt)));
  const existing = more ? $("transfers-list").querySelector("tbody") : null;
  if (existing) {
    existing.append(...rows);
  } else {
    fill($("transfers-list"), el("div", { class: "table-scroll" }, el("table", { id: "transfers-table" },
      el("thead", {}, el("tr", {}, ["transfer", "status", "amount", "from", "to", "accepted"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows))));
  }
  const shown = $("transfers-list").querySelectorAll("tbody tr").length;
  const old = $("transfers-count");
  if (old) old.remove();
  $("transfers-list").prepend(el("p", { class: "hint", id: "transfers-count" },
    shown ? `${shown} transfer(s) shown, newest first${body.next ? "" : "; no more"}.` : "No transfer matches."));
  $("transfers-more").hidden = !body.next;
}

// ---------- routing ----------

function decoded(part) {
  try {
    return decodeURIComponent(part);
  } catch (_) {
    return "";
  }
}

function route() {
  const [, view, rawArg] = (location.hash || "#/overview").split("/");
  const arg = rawArg ? decoded(rawArg) : "";
  const name = ["overview", "dlt", "transfer"].includes(view) ? view : "overview";
  for (const v of ["overview", "dlt", "transfer"]) {
    $(v).hidden = v !== name;
    $(`tab-${v}`).classList.toggle("active", v === name);
  }
  if (name === "dlt") {
    if (arg && arg !== $("dlt-topic").value) {
      state.wantedDlt = arg;
      fillDltSelect();
      // Another source: a plan made for the previous one must not be replayed.
      invalidatePlan();
    }
    $("dlt-hint").textContent = state.token
      ? "Choose a source and a selection; a replay is always preceded by its dry run."
      : "Counts are open; record contents and replay need the admin token.";
    loadReplayLog().catch((e) => fill($("replay-log"), el("h3", {}, "Replay log"), el("p", { class: "error" }, e.message)));
  }
  if (name === "transfer" && arg) {
    $("transfer-id").value = arg;
    lookupTransfer();
  }
}

function start() {
  $("token-form").addEventListener("submit", useToken);
  $("token-clear").addEventListener("click", forgetToken);
  $("ledger-run").addEventListener("click", () => once("ledger", refreshers().ledger).catch(() => {}));
  $("dlt-form").addEventListener("submit", loadDlt);
  $("dlt-form").addEventListener("input", invalidatePlan);
  $("dlt-topic").addEventListener("change", () => {
    state.wantedDlt = $("dlt-topic").value;
    syncDltInputs();
  });
  $("dlt-dry-run").addEventListener("click", dryRun);
  $("dlt-replay").addEventListener("click", replay);
  $("dlt-replay").setAttribute("data-needs-token", "");
  $("dlt-dry-run").setAttribute("data-needs-token", "");
  $("transfer-form").addEventListener("submit", lookupTransfer);
  $("transfers-form").addEventListener("submit", (e) => searchTransfers(e, false));
  $("transfers-more").addEventListener("click", () => searchTransfers(null, true));
  window.addEventListener("hashchange", route);
  invalidatePlan();
  renderMode();
  checkTokenConfigured();
  route();
  poll();
  setInterval(tickStale, 1000);
}

document.addEventListener("DOMContentLoaded", start);
