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
};

// ---------- small helpers ----------

function $(id) {
  return document.getElementById(id);
}

/** Creates an element; `attrs` values go through setAttribute, children are nodes or text. */
function el(tag, attrs, ...children) {
  const node = tag === "svg" || tag === "polyline"
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

function table(headers, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c))))));
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

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Calls the admin API; resolves to the JSON body, rejects with an ApiError. */
async function api(path, options = {}) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    // A hung connection must not hold a panel (or the poll) forever.
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  let body = null;
  try {
    body = await res.json();
  } catch (_) {
    body = null;
  }
  // /readyz answers 503 with its reasons and /admin/ledger/check 409 with the failed
  // invariants: those bodies are the answer, not an error.
  if (!res.ok && !(options.accept || []).includes(res.status)) {
    const err = body && body.error ? body.error : {};
    throw new ApiError(res.status, err.code || "http_" + res.status, err.message || `HTTP ${res.status}`);
  }
  return body;
}

// ---------- token ----------

function renderMode() {
  const operator = Boolean(state.token);
  $("mode").textContent = operator ? "operator" : "read-only";
  $("mode").className = operator ? "badge ok" : "badge";
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
    flash(e.status === 401 || e.status === 403 ? "That token is not accepted." : `Cannot check the token: ${e.message}`, "error");
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, candidate);
  $("token").value = "";
  renderMode();
  flash("Token accepted: pause, resume, replay and transfer lookup are on.", "ok");
  route();
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
    flash(`Cannot ${action} ${name}: ${e.message}`, "error");
  }
  await once("pipelines", refreshPipelines);
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
  } catch (e) {
    fill($("ledger").querySelector(".body"), el("span", { class: "badge bad" }, `check failed: ${e.message}`));
  } finally {
    $("ledger-run").disabled = false;
  }
}

/** Runs `job` unless its previous run is still going. */
function once(name, job) {
  if (state.inFlight.has(name)) return Promise.resolve();
  state.inFlight.add(name);
  return job().finally(() => state.inFlight.delete(name));
}

/** One round of refreshes; the next starts POLL_MS after this one ends, never sooner. */
async function poll() {
  const jobs = [once("pipelines", refreshPipelines), once("readiness", refreshReadiness), once("outbox", refreshOutbox)];
  // The slow panels run on their own (their `once` guard keeps them single): a DLT
  // inventory or a ledger check on a large database does not freeze the others.
  if (state.polls % DLT_EVERY === 0) once("dlt", refreshDltSummary);
  if (Date.now() - state.ledgerAt > LEDGER_EVERY_MS) once("ledger", refreshLedger);
  state.polls += 1;
  const results = await Promise.allSettled(jobs);
  setTimeout(poll, POLL_MS);
  const failed = results.filter((r) => r.status === "rejected");
  $("updated").textContent = failed.length
    ? `Some panels could not refresh: ${failed[0].reason.message}`
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
      isTable && r.replayedAt ? el("span", { class: "badge ok" }, `replayed ${r.replayedAt}`) : null),
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
  state.dryRunGeneration += 1;
  $("dlt-replay").dataset.blocked = "1";
  $("dlt-replay").disabled = true;
  $("dlt-replay").textContent = "Replay";
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
    fill($("dlt-result"),
      el("p", { id: "dlt-plan" }, `A replay would republish ${body.wouldReplay} record(s) to their original topics.`),
      body.scanTruncated ? el("p", { class: "error" }, "The scan for newer records was cut short: the counts below may be low.") : null,
      warnings.length
        ? el("p", { class: "error" }, `${warnings.length} key(s) already have newer processed records: replaying may apply an older state after a newer one.`)
        : null,
      body.records.length
        ? table(["record", "to", "key", "newer processed of key"], body.records.map((r) => [
          r.id !== undefined ? `#${r.id}` : `${r.partition}/${r.offset}`,
          `${r.originalTopic} ${r.originalPartition}/${r.originalOffset ?? "?"}`, r.key ?? "–", fmtNum(r.newerProcessedOfKey)]))
        : null);
    if (body.wouldReplay > 0) {
      state.planned = { source: selection.source, count: body.wouldReplay, bodies: exactReplays(selection.source, selection.body, body.records) };
      $("dlt-replay").dataset.blocked = "0";
      $("dlt-replay").textContent = `Replay ${body.wouldReplay} record(s)`;
      renderMode();
    }
  } catch (e) {
    if (generation !== state.dryRunGeneration) return;
    fill($("dlt-result"), el("p", { class: "error" }, `Dry run failed: ${e.message}`));
  }
}

async function replay() {
  const planned = state.planned;
  if (!planned) return;
  invalidatePlan();
  let replayed = 0;
  $("dlt-dry-run").dataset.blocked = "1";
  renderMode();
  try {
    for (const body of planned.bodies) {
      replayed += (await api(replayPath(planned.source, false), { method: "POST", body })).replayed;
    }
    fill($("dlt-result"), el("p", { id: "dlt-replayed", class: "ok" }, `Replayed ${replayed} record(s).`));
    flash(`Replayed ${replayed} record(s).`, "ok");
  } catch (e) {
    fill($("dlt-result"), el("p", { class: "error" }, `Replay failed after ${replayed} record(s): ${e.message}`));
  }
  $("dlt-dry-run").dataset.blocked = "0";
  renderMode();
  await Promise.allSettled([once("dlt", refreshDltSummary), loadDlt()]);
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
  }
  if (name === "transfer" && arg) {
    $("transfer-id").value = arg;
    lookupTransfer();
  }
}

function start() {
  $("token-form").addEventListener("submit", useToken);
  $("token-clear").addEventListener("click", forgetToken);
  $("ledger-run").addEventListener("click", () => once("ledger", refreshLedger));
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
  window.addEventListener("hashchange", route);
  invalidatePlan();
  renderMode();
  route();
  poll();
}

document.addEventListener("DOMContentLoaded", start);
