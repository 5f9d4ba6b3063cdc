"use strict";
// streampool console: polls the gateway's snapshot (workers, queues, tenants, batches, the last
// minutes' tokens a second and queue depth) once a second and the job list with its filters every
// other second, and follows the stream of the job opened from the list (its replay, then live).
// Every read needs an admin key or the metrics token (where the gateway asks for keys): a 401 or
// 403 shows the key form; the key is kept for this tab, as the playground keeps its own.

const SNAPSHOT_MS = 1000; // the gateway reads Redis for it at most once a second whatever polls it
const JOBS_MS = 2000;
const RECONNECT_MS = 1000;
const KEY_STORAGE = "streampool.apiKey";
const ACTIVE = new Set(["queued", "running"]);
const TERMINAL = { done: "completed", cancelled: "cancelled", error: "failed" }; // event type -> state
const LIMITS = { queued_jobs: "max_queued_jobs", requests_last_minute: "requests_per_minute",
  tokens_last_minute: "tokens_per_minute" };

const $ = (id) => document.getElementById(id);
const ui = {
  updated: $("updated"), auth: $("auth"), authReason: $("auth-reason"), apiKey: $("api-key"), error: $("error"),
  rateChart: $("rate-chart"), queuedChart: $("queued-chart"), rateNow: $("rate-now"), queuedNow: $("queued-now"),
  workers: $("workers").tBodies[0], queues: $("queues").tBodies[0], tenants: $("tenants").tBodies[0],
  batches: $("batches").tBodies[0], jobs: $("jobs").tBodies[0], filters: $("filters"),
  job: $("job"), jobId: $("job-id"), jobState: $("job-state"), jobModel: $("job-model"), jobWorker: $("job-worker"),
  jobTokens: $("job-tokens"), jobAttempts: $("job-attempts"), jobText: $("job-text"), jobOpen: $("job-open"),
  cancelJob: $("cancel-job"), closeJob: $("close-job"),
};

let apiKey = sessionStorage.getItem(KEY_STORAGE) ?? "";
let opened = null; // the id of the job on show
let following = null; // the AbortController of its stream
const timers = {};
const runs = {};

// ---- talking to the gateway

class Refused extends Error {}

const authorization = () => (apiKey ? { Authorization: `Bearer ${apiKey}` } : {});

async function fetchJSON(url, options = {}) {
  const response = await fetch(url, { ...options, headers: authorization() });
  const body = await response.json().catch(() => null);
  if (response.status === 401 || response.status === 403) {
    askForKey(body?.error);
    throw new Refused(body?.error ?? `HTTP ${response.status}`);
  }
  if (!response.ok) throw new Error(`${body?.error ?? "HTTP error"} (${response.status} ${body?.error_type ?? ""})`);
  return body;
}

function askForKey(reason) {
  ui.authReason.textContent = apiKey && reason ? `The key was refused: ${reason}`
    : "The console needs an admin key or the metrics token.";
  ui.auth.hidden = false;
}

function useKey(event) {
  event.preventDefault();
  apiKey = ui.apiKey.value.trim();
  try {
    sessionStorage.setItem(KEY_STORAGE, apiKey);
  } catch {
    // Storage off: the key lasts until a reload.
  }
  ui.apiKey.value = "";
  ui.auth.hidden = true;
  for (const poll of [pollSnapshot, pollJobs]) poll();
  if (opened) followJob(opened);
}

/** Runs `read` now and every `ms` after it ends, in one chain a name (a new call replaces the chain);
 * a refusal stops it until a key is given. */
async function every(name, ms, read) {
  clearTimeout(timers[name]);
  const run = (runs[name] = (runs[name] ?? 0) + 1);
  try {
    await read();
    showError("");
  } catch (err) {
    if (err instanceof Refused) return;
    showError(err.message);
  }
  if (runs[name] === run) timers[name] = setTimeout(() => every(name, ms, read), ms);
}

function showError(message) {
  ui.error.textContent = message;
  ui.error.hidden = !message;
}

// ---- formatting

const text = (value) => (value === null || value === undefined ? "—" : String(value));
const fixed = (value, digits = 1) => (value === null || value === undefined ? "—" : value.toFixed(digits));
const percent = (share) => (share === null || share === undefined ? "—" : `${(share * 100).toFixed(0)} %`);

function seconds(value) {
  if (value === null || value === undefined) return "—";
  if (value < 60) return `${value.toFixed(value < 10 ? 1 : 0)} s`;
  if (value < 3600) return `${Math.floor(value / 60)} min ${Math.floor(value % 60)} s`;
  return `${(value / 3600).toFixed(1)} h`;
}

function of(count, limit) {
  return limit ? `${count} / ${limit}` : String(count);
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.append(cell);
    else td.textContent = text(cell);
    tr.append(td);
  }
  return tr;
}

function fill(body, rows, columns, empty) {
  body.replaceChildren(...(rows.length ? rows : [row([empty])]));
  if (!rows.length) body.rows[0].cells[0].colSpan = columns;
}

function sparkline(svg, values) {
  const most = Math.max(1, ...values);
  const step = values.length > 1 ? 300 / (values.length - 1) : 0;
  const points = values.map((value, index) => `${(index * step).toFixed(1)},${(58 - (value / most) * 56).toFixed(1)}`);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points.join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("vector-effect", "non-scaling-stroke");
  svg.replaceChildren(line);
  svg.dataset.points = String(values.length);
  svg.dataset.max = String(Math.max(0, ...values));
}

// ---- the snapshot

async function readSnapshot() {
  const snapshot = await fetchJSON("/v1/console/snapshot");
  showWorkers(snapshot.workers);
  showQueues(snapshot.queues);
  showTenants(snapshot.tenants);
  showBatches(snapshot.batches);
  const history = snapshot.history;
  sparkline(ui.rateChart, history.map((point) => point.tokens_per_second));
  sparkline(ui.queuedChart, history.map((point) => point.queued));
  ui.rateNow.textContent = fixed(history.at(-1)?.tokens_per_second);
  ui.queuedNow.textContent = text(history.at(-1)?.queued);
  ui.updated.textContent = `updated ${new Date(snapshot.at * 1000).toLocaleTimeString()}`;
  showChoices("model", snapshot.queues.map((queue) => queue.model));
  showChoices("tenant", snapshot.tenants.map((tenant) => tenant.name));
}

function showWorkers(workers) {
  const rows = workers.map((worker) => {
    const tr = row([
      worker.worker_id, worker.model, of(worker.running_jobs, worker.max_jobs), fixed(worker.tokens_per_second),
      fixed(worker.steps_per_second), worker.generated_tokens, percent(worker.kv_cache_usage),
      `${seconds(worker.heartbeat_age)} ago`, worker.draining ? "draining" : "serving",
    ]);
    tr.dataset.worker = worker.worker_id;
    return tr;
  });
  fill(ui.workers, rows, 9, "No live worker.");
}

function showQueues(queues) {
  const rows = queues.map((queue) => row([
    queue.model, queue.workers, queue.queued, queue.batch_queued, seconds(queue.oldest_wait),
  ]));
  fill(ui.queues, rows, 5, "No model known.");
}

function showTenants(tenants) {
  const rows = tenants.map(({ name, usage, limits }) => row([
    name, of(usage.running_jobs, limits.max_running_jobs), of(usage.queued_jobs, limits[LIMITS.queued_jobs]),
    of(usage.requests_last_minute, limits[LIMITS.requests_last_minute]),
    of(usage.tokens_last_minute, limits[LIMITS.tokens_last_minute]), usage.tokens_total,
  ]));
  fill(ui.tenants, rows, 6, "No tenants: the gateway's keys name none.");
}

function showBatches(batches) {
  const rows = batches.map((batch) => {
    const done = batch.completed + batch.failed + batch.refused;
    const bar = document.createElement("progress");
    bar.max = Math.max(1, batch.total);
    bar.value = done;
    bar.textContent = `${done} of ${batch.total}`;
    return row([batch.id, batch.status, batch.endpoint,
      `${batch.completed} ok, ${batch.failed + batch.refused} failed, ${batch.in_flight} under way, of ${batch.total}`, bar]);
  });
  fill(ui.batches, rows, 5, "No batch in progress.");
}

/** The filter's choices: what the snapshot knows, and the one picked even when it has gone. */
function showChoices(name, values) {
  const select = ui.filters.elements[name];
  const picked = select.value;
  const names = [...new Set([...values, ...(picked ? [picked] : [])])].sort();
  const current = [...select.options].slice(1).map((option) => option.value);
  if (names.join("\n") === current.join("\n")) return;
  select.replaceChildren(new Option("any", ""), ...names.map((value) => new Option(value, value)));
  select.value = picked;
}

// ---- the jobs

function filterQuery() {
  const query = new URLSearchParams();
  for (const [name, value] of new FormData(ui.filters)) if (value) query.set(name, value);
  return query;
}

async function readJobs() {
  const query = filterQuery();
  const list = await fetchJSON(`/v1/console/jobs?${query}`);
  if (String(filterQuery()) !== String(query)) return; // the filters changed while this was read
  const now = Date.now() / 1000;
  const rows = list.data.map((job) => {
    const open = document.createElement("button");
    open.type = "button";
    open.className = "link";
    open.textContent = job.id;
    open.title = ACTIVE.has(job.status) ? "Follow this job" : "Show this job's output";
    open.addEventListener("click", () => openJob(job.id));
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.textContent = "Cancel";
    cancel.disabled = !ACTIVE.has(job.status);
    cancel.addEventListener("click", () => cancelJob(job.id, cancel));
    const tr = row([open, job.status, job.model, job.tenant, seconds(now - job.created_at), job.token_count, cancel]);
    tr.dataset.job = job.id;
    tr.dataset.state = job.status;
    return tr;
  });
  fill(ui.jobs, rows, 7, "No job matches.");
}

async function cancelJob(id, button) {
  if (button) button.disabled = true;
  try {
    await fetchJSON(`/v1/console/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
    showError("");
  } catch (err) {
    showError(`Cancel failed: ${err.message}`);
  }
  pollJobs();
}

function openJob(id) {
  opened = id;
  ui.job.hidden = false;
  ui.jobId.textContent = id;
  ui.jobOpen.href = `/?job=${encodeURIComponent(id)}`;
  history.replaceState(null, "", `?job=${encodeURIComponent(id)}`);
  followJob(id);
}

function closeJob() {
  opened = null;
  following?.abort();
  ui.job.hidden = true;
  history.replaceState(null, "", location.pathname);
}

/** The job's record: its model, worker and attempts (its state and output come from its stream). */
async function showRecord(id) {
  const record = await fetchJSON(`/v1/console/jobs/${encodeURIComponent(id)}`);
  if (opened !== id) return;
  ui.jobModel.textContent = text(record.model);
  ui.jobWorker.textContent = text(record.worker);
  ui.jobAttempts.textContent = record.attempts;
}

function showState(state) {
  ui.job.dataset.state = state;
  ui.jobState.textContent = state;
  ui.cancelJob.disabled = !ACTIVE.has(state);
}

/** The opened job's events, from the start of its stream (a replay, then live) to its end, through the
 * console's route (any owner's job); after a dropped connection, again from the last event seen. */
async function followJob(id) {
  following?.abort();
  const controller = new AbortController();
  following = controller;
  const seen = { lastEventId: "", tokens: 0, ended: false };
  ui.jobText.textContent = "";
  ui.jobTokens.textContent = "0";
  showState("…");
  showRecord(id).catch((err) => showError(err.message));
  while (!controller.signal.aborted && !seen.ended) {
    const after = seen.lastEventId ? `?after=${encodeURIComponent(seen.lastEventId)}` : "";
    try {
      const response = await fetch(`/v1/console/jobs/${encodeURIComponent(id)}/events${after}`, {
        headers: { ...authorization(), Accept: "text/event-stream" }, signal: controller.signal,
      });
      if (!response.ok) {
        const body = await response.json().catch(() => null);
        if (response.status === 401 || response.status === 403) askForKey(body?.error);
        else showError(`${body?.error ?? "HTTP error"} (${response.status})`);
        return;
      }
      await readEvents(response, (event, eventId) => onJobEvent(id, event, eventId, seen));
    } catch {
      // dropped, or aborted (closed, or another job opened): the loop's condition says which
    }
    if (!seen.ended) await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
  }
}

/** Hands each event of a `text/event-stream` answer to `dispatch`, with its id, until the body ends. */
async function readEvents(response, dispatch) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  let eventId = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    const lines = (buffer + value).split(/\r\n|\r|\n/);
    buffer = lines.pop();
    for (const line of lines) {
      if (line === "") {
        if (data.length) dispatch(JSON.parse(data.join("\n")), eventId);
        data = [];
      } else if (line.startsWith("data:")) {
        data.push(line.slice(5).replace(/^ /, ""));
      } else if (line.startsWith("id:")) {
        eventId = line.slice(3).trim();
      }
    }
  }
}

function onJobEvent(id, event, eventId, seen) {
  if (opened !== id || event.seq === undefined) return; // another job's, or the gateway's own failure
  seen.lastEventId = eventId;
  if (event.type === "status") {
    showState(event.state);
  } else if (event.type === "delta") {
    seen.tokens += event.token_ids.length;
    ui.jobTokens.textContent = seen.tokens;
    ui.jobText.append(event.text);
  } else if (event.type in TERMINAL) {
    seen.ended = true;
    showState(TERMINAL[event.type]);
    showRecord(id).catch((err) => showError(err.message));
  }
}

const pollSnapshot = () => every("snapshot", SNAPSHOT_MS, readSnapshot);
const pollJobs = () => every("jobs", JOBS_MS, readJobs);

ui.auth.addEventListener("submit", useKey);
ui.filters.addEventListener("change", pollJobs);
ui.closeJob.addEventListener("click", closeJob);
ui.cancelJob.addEventListener("click", () => opened && cancelJob(opened, ui.cancelJob));

pollSnapshot();
pollJobs();
const jobParam = new URLSearchParams(location.search).get("job");
if (jobParam) openJob(jobParam);
