"use strict";
// streampool playground: submit a job, follow its events over SSE, and pick the stream up
// again after a reload, from the text and last event id kept in sessionStorage.
// A chat goes to /v1/chat/completions as a stored, streamed chat completion instead: its job
// outlives the tab, and a reload resumes its chunks after the ones kept (`starting_after`).
// A response goes to /v1/responses, streamed, in the background when asked (then a reload resumes
// its events after the last one shown: `starting_after`). A chat or a response continues the
// conversation of the one before it (its messages, or `previous_response_id`) until a new one is begun.
// The page opens in Chat mode for a model whose card has a chat template.
// A gateway that asks for an API key (401) gets one pasted into the page; EventSource cannot
// send it, so with a key the events are read from a fetch() of the same SSE stream instead.

const TERMINAL = { done: "completed", cancelled: "cancelled", error: "failed" }; // event type -> state
const FINISHED = new Set(Object.values(TERMINAL));
const ACTIVE = new Set(["submitting", "queued", "running"]);
const NUMBERS = ["max_tokens", "temperature", "top_p", "top_k", "seed", "stream_step"];
const JOB_ONLY = ["stream_step"]; // native fields that chat completions and responses do not take
const RESPONSE_END = { completed: "completed", incomplete: "completed", failed: "failed", cancelled: "cancelled" };
const EVENTS_SHOWN = 2000; // the most events the Events list reads of one job
const KEY_STORAGE = "streampool.apiKey";
const JOB_ID_HEADER = "X-Streampool-Job-Id";
const RECONNECT_MS = 1000;

const $ = (id) => document.getElementById(id);
const ui = {
  form: $("request"), promptInput: $("prompt-input"), chatInput: $("chat-input"),
  responsesInput: $("responses-input"), modeHint: $("mode-hint"), newChat: $("new-chat"),
  conversation: $("conversation"), events: $("events"), eventsLog: $("events-log"),
  generate: $("generate"), cancel: $("cancel"), model: $("model"),
  section: $("job"), jobId: $("job-id"), state: $("state"), ttft: $("ttft"), tokens: $("tokens"),
  rate: $("rate"), error: $("error"), outcome: $("outcome"), text: $("text"),
  auth: $("auth"), authReason: $("auth-reason"), apiKey: $("api-key"),
};

/** The job on show (see newJob); saved to sessionStorage after every event. */
let job = null;
/** What follows `job` while its stream is open: an EventSource, or a fetch() stream's `{close}`. */
let source = null;
/** The API key the gateway asked for, kept for this tab only ("" when none is needed). */
let apiKey = sessionStorage.getItem(KEY_STORAGE) ?? "";
/** Each model's canonical name, and whether its card has a chat template. */
let chats = {};
/** Whether the mode was picked by hand (or came back with a job): the model no longer picks it. */
let modePicked = false;

function newJob(id, request, submittedAt, transcript = []) {
  return {
    id, request, state: "queued", text: "", lastEventId: "", tokens: 0, cancelling: false,
    submittedAt, firstTokenAt: null, firstTokens: 0, lastTokenAt: null, outcome: "", error: "",
    chat: Array.isArray(request?.messages), chunks: 0, // a chat: the chunks of its answer shown so far
    responses: request?.input !== undefined, responseId: null, sequence: null, // a response's id, last event
    transcript, // the conversation's earlier turns, as {role, content}
  };
}

// ---- the request form

const ESCAPES = { n: "\n", t: "\t", "\\": "\\" };
const unescapeStop = (line) => line.replace(/\\([nt\\])/g, (_, c) => ESCAPES[c]);
const escapeStop = (stop) => stop.replace(/[\\\n\t]/g, (c) => ({ "\\": "\\\\", "\n": "\\n", "\t": "\\t" })[c]);

function showMode() {
  const mode = ui.form.elements.mode.value;
  // disabled: left out of validation, and of the body
  ui.promptInput.hidden = ui.promptInput.disabled = mode !== "prompt";
  ui.chatInput.hidden = ui.chatInput.disabled = mode !== "chat";
  ui.responsesInput.hidden = ui.responsesInput.disabled = mode !== "responses";
  for (const name of JOB_ONLY) ui.form.elements[name].disabled = mode !== "prompt";
  render();
}

/** The mode the picked model is best tried in: Chat where its card has a chat template. */
function suggestMode() {
  const option = ui.model.selectedOptions[0];
  const chatting = chats[option?.dataset.root ?? ""];
  ui.modeHint.textContent = chatting === false ? "No chat template is known for this model: Prompt mode." : "";
  if (modePicked || chatting === undefined) return;
  ui.form.elements.mode.value = chatting ? "chat" : "prompt";
  showMode();
}

/** The conversation the next chat or response continues: the last one's turns and its answer, while it
 * is of the mode on show, ended well, and no new conversation was begun. */
function conversationSoFar(mode) {
  const kind = job?.responses ? "responses" : job?.chat ? "chat" : "prompt";
  if (!job || job.closed || kind !== mode || mode === "prompt" || job.state !== "completed") return null;
  const said = job.chat ? job.request.messages.findLast((m) => m.role === "user").content : job.request.input;
  return {
    transcript: [...job.transcript, { role: "user", content: said }, { role: "assistant", content: job.text }],
    previous: job.responseId,
  };
}

/** The POST /v1/jobs body (a chat's, a response's: see chatBody, responseBody); empty optional fields
 * are left out, so the gateway's defaults apply. `earlier`: the conversation it continues. */
function requestBody(earlier) {
  const data = new FormData(ui.form);
  const body = {};
  if (data.get("mode") === "chat") {
    const system = data.get("system");
    body.messages = [
      ...(system.trim() ? [{ role: "system", content: system }] : []),
      ...(earlier?.transcript ?? []),
      { role: "user", content: data.get("user") },
    ];
  } else if (data.get("mode") === "responses") {
    body.input = data.get("input");
    body.background = data.get("background") === "on";
    if (earlier?.previous) body.previous_response_id = earlier.previous;
  } else {
    body.prompt = data.get("prompt");
  }
  for (const name of NUMBERS) {
    const value = (data.get(name) ?? "").trim();
    if (value !== "") body[name] = Number(value);
  }
  const stop = data.get("stop").split("\n").filter((line) => line !== "").map(unescapeStop);
  if (stop.length) body.stop = stop.length === 1 ? stop[0] : stop;
  const model = data.get("model"); // the picker sits in the header, in this form by its `form` attribute
  if (model) body.model = model;
  return body;
}

/** Shows the request of a job re-attached after a reload. */
function fillForm(body) {
  const fields = ui.form.elements;
  const chat = Array.isArray(body.messages);
  fields.mode.value = chat ? "chat" : body.input !== undefined ? "responses" : "prompt";
  modePicked = true;
  showMode();
  if (chat) {
    fields.system.value = body.messages.find((m) => m.role === "system")?.content ?? "";
    fields.user.value = body.messages.findLast((m) => m.role === "user")?.content ?? "";
  } else if (body.input !== undefined) {
    fields.input.value = body.input;
    fields.background.checked = Boolean(body.background);
  } else {
    fields.prompt.value = body.prompt;
  }
  for (const name of NUMBERS) fields[name].value = body[name] ?? "";
  if (body.model) pickModel(body.model);
  fields.stop.value = [body.stop ?? []].flat().map(escapeStop).join("\n");
}

// ---- talking to the gateway

const withKey = (headers = {}) => (apiKey ? { ...headers, Authorization: `Bearer ${apiKey}` } : headers);

/** JSON from the gateway; a failure throws with the gateway's `{error, error_type}`. */
async function fetchJSON(url, options = {}) {
  const response = await fetch(url, { ...options, headers: withKey(options.headers) });
  const body = await response.json().catch(() => null);
  if (!response.ok) throw new Error(refusal(response, body));
  return body;
}

/** Why the gateway refused, from its native `{error, error_type}` or OpenAI's `{error: {message, code}}`;
 * a 401 asks for a key. */
function refusal(response, body) {
  const openai = typeof body?.error === "object" ? body.error : null;
  const message = openai ? openai.message : body?.error;
  if (response.status === 401) askForKey(message);
  if (!message) return `HTTP ${response.status}`;
  return `${message} (${response.status} ${openai ? openai.code ?? openai.type : body.error_type})`;
}

const storageKey = (id) => `streampool.job.${id}`;

function save() {
  try {
    // Text and last event id go together, so a resume has no gap and no duplicate.
    sessionStorage.setItem(storageKey(job.id), JSON.stringify(job));
  } catch {
    // Storage full or off: a reload then replays the job from its start.
  }
}

function restore(id) {
  try {
    return JSON.parse(sessionStorage.getItem(storageKey(id)));
  } catch {
    return null;
  }
}

function follow() {
  const after = job.lastEventId ? `?after=${encodeURIComponent(job.lastEventId)}` : "";
  const url = `/v1/jobs/${encodeURIComponent(job.id)}/events${after}`;
  if (apiKey) return followWithKey(url);
  source = new EventSource(url);
  for (const type of ["status", "delta", "done", "cancelled"]) source.addEventListener(type, onEvent);
  source.addEventListener("error", onError);
}

function detach() {
  source?.close();
  source = null;
}

/** The events of a `text/event-stream` body, read with fetch() so that the key goes with it. */
function followWithKey(url) {
  const controller = new AbortController();
  const following = { close: () => controller.abort() };
  source = following;
  readEvents(url, controller.signal).then((ended) => {
    if (!ended || source !== following) return;
    // The stream closed before the job ended (the gateway went away): resume, as EventSource would.
    job.error ||= "Connection lost. Reconnecting…";
    render();
    setTimeout(() => source === following && follow(), RECONNECT_MS);
  });
}

/** Dispatches each event to the same handlers as EventSource's; true when the body ended by itself. */
async function readEvents(url, signal) {
  let response;
  try {
    response = await fetch(url, { headers: withKey({ Accept: "text/event-stream" }), signal });
  } catch {
    return !signal.aborted;
  }
  if (!response.ok) {
    detach();
    explainRefusal();
    return false;
  }
  return readBody(response, signal, (message) => (message.type === "error" ? onError : onEvent)(message));
}

/** Hands each event of a `text/event-stream` answer to `dispatch` as a MessageEvent; true when the body
 * ended by itself or the connection was lost, false once `signal` aborted it. */
async function readBody(response, signal, dispatch) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { type: "message", data: [] };
  let lastEventId = job.lastEventId;
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch {
      return !signal.aborted;
    }
    if (chunk.done) return true;
    const lines = (buffer + chunk.value).split(/\r\n|\r|\n/);
    buffer = lines.pop();
    for (const line of lines) {
      if (line === "") {
        if (event.data.length) {
          dispatch(new MessageEvent(event.type, { data: event.data.join("\n"), lastEventId }));
          if (signal.aborted) return false; // a terminal event detached the stream
        }
        event = { type: "message", data: [] };
        continue;
      }
      const colon = line.indexOf(":");
      if (colon === 0) continue; // a keep-alive comment
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") event.type = value;
      else if (field === "data") event.data.push(value);
      else if (field === "id") lastEventId = value;
    }
  }
}

/** A 401: show the key form, with why the gateway refused. */
function askForKey(reason) {
  ui.authReason.textContent = apiKey ? `The API key was refused: ${reason ?? "401"}` : "This gateway needs an API key.";
  ui.auth.hidden = false;
  ui.apiKey.focus();
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
  if (job?.state === "error") {
    job.error = "";
    render();
  }
  showModels();
  if (job?.id && !FINISHED.has(job.state) && !source) attach(job.id);
}

function onEvent(message) {
  const event = JSON.parse(message.data);
  job.error = "";
  if (event.type === "status") {
    job.state = event.state;
  } else if (event.type === "delta") {
    addDelta(event);
  } else {
    end(event);
  }
  job.lastEventId = message.lastEventId;
  save();
  render();
}

function addDelta(event) {
  addOutput(event.text, event.token_ids.length);
}

/** `text` and the count of its `tokens`, shown; timed only for jobs this tab submitted, not replays. */
function addOutput(text, tokens) {
  if (job.submittedAt && tokens) {
    const now = Date.now();
    if (job.firstTokenAt === null) {
      job.firstTokenAt = now;
      job.firstTokens = tokens;
    }
    job.lastTokenAt = now;
  }
  job.tokens += tokens;
  job.text += text;
  ui.text.append(text);
}

function end(event) {
  detach(); // or the browser reconnects when the gateway closes the finished stream
  job.state = TERMINAL[event.type];
  showOutcome(job.state, event.finish_reason, event.usage);
  if (event.type === "error") job.error = `Job failed: ${event.message} (${event.code})`;
}

function showOutcome(state, finishReason, usage) {
  const counts = usage && `${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`;
  if (state === "completed") job.outcome = `Finished (${finishReason}): ${counts}.`;
  if (state === "cancelled") job.outcome = `Cancelled: ${counts}.`;
}

/** The job's `error` event, the gateway's own failure, or a lost or refused connection. */
function onError(event) {
  if (event instanceof MessageEvent) {
    const data = JSON.parse(event.data);
    if (data.seq !== undefined) return onEvent(event); // the job failed: its terminal event
    // The gateway failed mid-stream (an event without id): the browser reconnects from the last real one.
    job.error = `Stream interrupted: ${data.message}. Reconnecting…`;
  } else if (source?.readyState === EventSource.CLOSED) {
    detach();
    return explainRefusal();
  } else {
    job.error ||= "Connection lost. Reconnecting…";
  }
  render();
}

/** EventSource cannot read why a stream was refused (404, 410, …): ask the same URL as JSON. */
async function explainRefusal() {
  const url = `/v1/jobs/${encodeURIComponent(job.id)}/events?limit=1&after=${encodeURIComponent(job.lastEventId)}`;
  try {
    await fetchJSON(url);
    job.error = "The event stream was refused. Reload the page to try again.";
  } catch (err) {
    job.error = err.message;
  }
  job.state = "error";
  render();
}

// ---- a chat: a stored chat completion, whose stream outlives the tab

/** The chat completion the form's `request` asks for: streamed, stored (so that its job runs on when
 * the tab goes, and its stream can be resumed), with the usage so far on every chunk (the token count). */
function chatBody(request) {
  const body = { ...request, stream: true, store: true };
  body.stream_options = { include_usage: true, continuous_usage_stats: true };
  for (const name of JOB_ONLY) delete body[name];
  return body;
}

/** Streams the chunks of `job`'s chat completion into the page from `url`: its POST, or its resumption
 * after the chunks already shown (`resumeChat`). */
function streamChat(url, init) {
  return streamAnswer(url, init, onChunk, lostChat);
}

/** Streams `job`'s answer from `url` (a POST that makes the job, or a resumption of its stream) into
 * `dispatch`, an event at a time; `lost(following)` when the stream fails or ends before the answer. */
async function streamAnswer(url, init, dispatch, lost) {
  const controller = new AbortController();
  const following = { close: () => controller.abort() };
  source = following;
  let response;
  try {
    response = await fetch(url, { ...init, headers: withKey(init.headers), signal: controller.signal });
  } catch {
    return lost(following);
  }
  if (!response.ok) {
    detach();
    job.state = "error";
    job.error = refusal(response, await response.json().catch(() => null));
    return render();
  }
  if (!job.id) { // the POST's answer: the job is admitted
    job.id = response.headers.get(JOB_ID_HEADER);
    job.state = "queued";
    history.replaceState(null, "", `?job=${encodeURIComponent(job.id)}`); // a reload resumes
    save();
    render();
  }
  if (await readBody(response, controller.signal, dispatch)) lost(following);
}

/** The chat's stream was cut before its `[DONE]` (a gateway stopping): its job goes on, so resume. */
function lostChat(following) {
  if (source !== following) return; // detached on purpose
  if (!job.id) {
    detach();
    job.state = "error";
    job.error = "Connection lost before the chat was accepted.";
    return render();
  }
  job.error ||= "Connection lost. Reconnecting…";
  render();
  setTimeout(() => source === following && resumeChat(), RECONNECT_MS);
}

function resumeChat() {
  const chunks = `/v1/chat/completions/${encodeURIComponent(job.id)}/chunks`;
  streamChat(`${chunks}?starting_after=${job.chunks}`, { headers: { Accept: "text/event-stream" } });
}

function onChunk(message) {
  if (message.data === "[DONE]") return endChat();
  const chunk = JSON.parse(message.data);
  if (chunk.error) { // how the job ended (a cancel, a failure): `[DONE]` follows; not one of the counted
    job.failure = chunk.error;
    return;
  }
  job.chunks += 1; // kept with the text it brought, so that a resume has no gap and no duplicate
  job.state = "running";
  job.error = "";
  const tokens = chunk.usage ? chunk.usage.completion_tokens - job.tokens : 0;
  addOutput(chunk.choices[0]?.delta?.content ?? "", tokens);
  save();
  render();
}

/** After `[DONE]`: the job's record says how it ended, and with what usage. */
async function endChat() {
  detach();
  try {
    const record = await fetchJSON(`/v1/jobs/${encodeURIComponent(job.id)}`);
    job.state = FINISHED.has(record.status) ? record.status : "error";
    job.tokens = record.output.token_count;
    showOutcome(job.state, record.finish_reason, record.usage);
    const why = job.failure ? `${job.failure.message} (${job.failure.code})` : record.error;
    if (job.state === "failed") job.error = `Job failed: ${why}`;
    if (job.state === "error") job.error = `The stream failed: ${why ?? "no reason given"}. Reload to resume it.`;
  } catch (err) {
    job.state = "error";
    job.error = err.message;
  }
  save();
  render();
}

// ---- a response: /v1/responses, streamed; in the background, it outlives the tab and resumes

/** The response the form's `request` asks for: streamed and stored, its token bound by its own name. */
function responseBody(request) {
  const { max_tokens: maxTokens, ...body } = request;
  for (const name of JOB_ONLY) delete body[name];
  return { ...body, ...(maxTokens ? { max_output_tokens: maxTokens } : {}), stream: true, store: true };
}

/** Streams `job`'s response events into the page from `url`: its POST, or its resumption after the last
 * event shown (`resumeResponse`). */
function streamResponse(url, init) {
  return streamAnswer(url, init, onResponseEvent, lostResponse);
}

function lostResponse(following) {
  if (source !== following) return; // detached on purpose, or ended
  detach();
  if (!job.id || !job.request.background) {
    job.state = "error";
    job.error = "Connection lost: only a background response can be resumed.";
    return render();
  }
  job.error ||= "Connection lost. Reconnecting…";
  render();
  setTimeout(resumeResponse, RECONNECT_MS);
}

function resumeResponse() {
  const after = job.sequence === null ? "" : `&starting_after=${job.sequence}`;
  const url = `/v1/responses/${encodeURIComponent(job.responseId ?? `resp_${job.id}`)}?stream=true${after}`;
  streamResponse(url, { headers: { Accept: "text/event-stream" } });
}

function onResponseEvent(message) {
  const event = JSON.parse(message.data);
  job.sequence = event.sequence_number ?? job.sequence;
  job.error = "";
  if (event.response?.id) job.responseId = event.response.id;
  if (event.type === "response.output_text.delta") {
    job.state = "running";
    addOutput(event.delta, 1); // a delta a token, as the response is streamed; its usage says at the end
  } else if (event.type === "response.in_progress") {
    job.state = "running";
  } else if (event.type in RESPONSE_EVENTS_ENDING) {
    detach();
    const usage = event.response.usage;
    job.state = RESPONSE_END[event.response.status] ?? "failed";
    if (usage) job.tokens = usage.output_tokens;
    const counts = usage && { prompt_tokens: usage.input_tokens, completion_tokens: usage.output_tokens };
    const reason = event.response.incomplete_details?.reason ?? "stop";
    showOutcome(job.state, reason, counts);
    if (job.state === "failed") job.error = `Response failed: ${event.response.error?.message ?? "no reason given"}`;
  }
  save();
  render();
}

const RESPONSE_EVENTS_ENDING = {
  "response.completed": true, "response.incomplete": true, "response.failed": true, "response.cancelled": true,
};

// ---- the job's events, on demand

/** The job's events as its stream holds them, read when the list is opened (and again at the job's end). */
async function showEvents() {
  if (!ui.events.open || !job?.id) return;
  const shown = [];
  let cursor = "0";
  try {
    while (shown.length < EVENTS_SHOWN) {
      const page = await fetchJSON(`/v1/jobs/${encodeURIComponent(job.id)}/events?after=${cursor}&limit=500`);
      shown.push(...page.events);
      cursor = page.cursor;
      if (page.done || !page.events.length) break;
    }
  } catch (err) {
    shown.push({ error: err.message });
  }
  ui.eventsLog.replaceChildren(...shown.map((event) => {
    const item = document.createElement("li");
    item.textContent = JSON.stringify(event);
    return item;
  }));
}

// ---- actions

async function generate(event) {
  event.preventDefault();
  if (job && ACTIVE.has(job.state)) return;
  detach();
  if (job?.id) sessionStorage.removeItem(storageKey(job.id));
  history.replaceState(null, "", location.pathname); // the old job's id leaves the URL
  const earlier = conversationSoFar(ui.form.elements.mode.value);
  const request = requestBody(earlier);
  job = newJob(null, request, Date.now(), earlier?.transcript ?? []);
  job.state = "submitting";
  ui.text.textContent = "";
  ui.eventsLog.replaceChildren();
  render();
  if (job.responses) {
    const init = { method: "POST", body: JSON.stringify(responseBody(request)) };
    return streamResponse("/v1/responses", { ...init, headers: { "Content-Type": "application/json" } });
  }
  if (job.chat) {
    const init = { method: "POST", body: JSON.stringify(chatBody(request)) };
    return streamChat("/v1/chat/completions", { ...init, headers: { "Content-Type": "application/json" } });
  }
  try {
    const accepted = await fetchJSON("/v1/jobs", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(request),
    });
    job.id = accepted.id;
    job.state = accepted.status;
  } catch (err) {
    job.state = "error";
    job.error = err.message;
    render();
    return;
  }
  history.replaceState(null, "", `?job=${encodeURIComponent(job.id)}`); // a reload re-attaches
  save();
  render();
  follow();
}

/** The next chat or response begins a conversation of its own. */
function newConversation() {
  if (job) {
    job.closed = true;
    if (job.id) save();
  }
  render();
}

async function cancel() {
  const target = job;
  target.cancelling = true;
  render();
  try {
    await fetchJSON(`/v1/jobs/${encodeURIComponent(target.id)}/cancel`, { method: "POST" });
    // The stream ends with `cancelled` (or `done`, if the job finished first).
  } catch (err) {
    target.error = `Cancel failed: ${err.message}`;
    target.cancelling = false;
    render();
  }
}

/** After a reload (or from a shared link): show what this tab saw, then stream the rest. */
async function attach(id) {
  const saved = restore(id);
  job = saved ?? newJob(id, null, null);
  if (job.request) fillForm(job.request);
  ui.text.textContent = job.text;
  render();
  if (saved && FINISHED.has(job.state)) return; // its terminal event is already here
  if (job.chat) return resumeChat(); // a 404 says why it cannot be (another key's, or expired)
  if (job.responses) return resumeResponse();
  try {
    await fetchJSON(`/v1/jobs/${encodeURIComponent(id)}`); // 404 for an unknown or expired job
  } catch (err) {
    job.state = "error";
    job.error = err.message;
    render();
    return;
  }
  follow();
}

/** The model picker: every name /v1/models lists; one without a live worker still takes jobs
 * (they queue until a worker of it starts), and says so. */
async function showModels() {
  const picked = ui.model.value;
  try {
    const [models, chatModels] = await Promise.all([fetchJSON("/v1/models"), fetchJSON("/v1/playground/models")]);
    chats = chatModels;
    const options = models.data.map((model) => {
      const option = new Option(model.workers ? model.id : `${model.id} (no live worker)`, model.id);
      option.title = `${model.workers} live workers, ${model.queue_depth} jobs queued`;
      option.dataset.root = model.parent ?? model.root; // the model of an adapter's name too
      return option;
    });
    ui.model.replaceChildren(...(options.length ? options : [new Option("none (no model known)", "")]));
    ui.model.disabled = !options.length;
    pickModel(job?.request?.model ?? picked);
    suggestMode();
  } catch (err) {
    ui.model.replaceChildren(new Option(`unknown (${err.message})`, ""));
    ui.model.disabled = true;
  }
}

function pickModel(name) {
  if ([...ui.model.options].some((option) => option.value === name)) ui.model.value = name;
}

// ---- the view

function tokensPerSecond() {
  const seconds = (job.lastTokenAt - job.firstTokenAt) / 1000;
  const tokens = job.tokens - job.firstTokens; // the rate after the first token
  return job.firstTokenAt !== null && seconds > 0 && tokens > 0 ? (tokens / seconds).toFixed(1) : "—";
}

function render() {
  const state = job?.state ?? "idle";
  ui.section.dataset.state = state;
  ui.state.textContent = state;
  if (job?.id && ui.jobId.textContent !== job.id) {
    const link = document.createElement("a");
    link.href = `/v1/jobs/${encodeURIComponent(job.id)}`;
    link.textContent = job.id;
    ui.jobId.replaceChildren(link);
  } else if (!job?.id) {
    ui.jobId.textContent = "—";
  }
  ui.tokens.textContent = job?.tokens ?? 0;
  ui.ttft.textContent = job?.submittedAt && job.firstTokenAt ? `${job.firstTokenAt - job.submittedAt} ms` : "—";
  ui.rate.textContent = job ? tokensPerSecond() : "—";
  ui.error.textContent = job?.error ?? "";
  ui.error.hidden = !job?.error;
  ui.outcome.textContent = job?.outcome ?? "";
  ui.outcome.hidden = !job?.outcome;
  ui.text.setAttribute("aria-busy", String(ACTIVE.has(state)));
  ui.generate.disabled = ACTIVE.has(state);
  ui.cancel.disabled = !(state === "queued" || state === "running") || job.cancelling;
  renderConversation();
  if (job?.id && FINISHED.has(state) && ui.events.dataset.shown !== job.id) {
    ui.events.dataset.shown = job.id; // its whole stream, once, if the list is open
    showEvents();
  }
}

/** The conversation's earlier turns and the message of the one on show, above its answer. */
function renderConversation() {
  const mode = ui.form.elements.mode.value;
  const kind = job?.responses ? "responses" : job?.chat ? "chat" : "prompt";
  const open = job?.request && !job.closed && kind === mode && mode !== "prompt";
  const said = job?.chat ? job.request.messages.findLast((m) => m.role === "user")?.content : job?.request?.input;
  const turns = open ? [...job.transcript, { role: "user", content: said }] : [];
  if (ui.conversation.childElementCount !== turns.length || !open) {
    ui.conversation.replaceChildren(...turns.map(({ role, content }) => {
      const item = document.createElement("li");
      item.dataset.role = role;
      item.textContent = content;
      return item;
    }));
  }
  ui.conversation.hidden = !turns.length;
  ui.newChat.hidden = !(open && (job.transcript.length || FINISHED.has(job.state)));
}

ui.form.addEventListener("submit", generate);
ui.form.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    ui.form.requestSubmit();
  }
});
for (const radio of ui.form.elements.mode) {
  radio.addEventListener("change", () => {
    modePicked = true;
    showMode();
  });
}
ui.model.addEventListener("change", suggestMode);
ui.cancel.addEventListener("click", cancel);
ui.newChat.addEventListener("click", newConversation);
ui.events.addEventListener("toggle", showEvents);
ui.auth.addEventListener("submit", useKey);

showMode();
showModels();
const jobParam = new URLSearchParams(location.search).get("job");
if (jobParam) attach(jobParam);
else render();
