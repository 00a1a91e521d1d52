// Hearth's chat page. Plain JS, no build step, no outside assets. The scripts, in the order
// index.html loads them: vendor/ (marked, DOMPurify, highlight.js), render.js (markdown to safe
// DOM), messages.js (the conversation's elements, copying), edits.js (retry, edit, branch),
// this file (the API, sessions and snapshots, a turn, wiring).
//
// Talks only to this server's own API (docs/api.md, docs/sessions.md); every call carries the key
// from the settings (kept in localStorage). A turn streams from POST /v1/chat/completions and is
// stopped through POST /v1/cancel with the turn's own cancel_id. Where the server has no sessions
// API, the conversation is kept in the tab and sent whole each turn.
"use strict";

const $ = (id) => document.getElementById(id);
const store = {
  get: (k, d = "") => localStorage.getItem("hearth." + k) ?? d,
  set: (k, v) => (v === "" || v == null ? localStorage.removeItem("hearth." + k) : localStorage.setItem("hearth." + k, v)),
};

const state = {
  sessionsApi: null, // null: not known yet; true / false once GET /v1/sessions answered
  sessionId: null, // the open session; null for a new chat not sent yet
  local: [], // the conversation, when the server keeps no sessions
  count: 0, // messages in the open conversation's transcript (the server's, or `local`)
  running: null, // the turn in flight: {cancelId, controller, stopping}
  model: null,
  models: [], // GET /v1/models's data: the picker's entries
};

// ---------------------------------------------------------------- API

class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function headers(json = true) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function errorFrom(resp) {
  let message = resp.statusText || "request failed";
  let code = null;
  try {
    const body = await resp.json();
    if (body && body.error) {
      message = body.error.message || message;
      code = body.error.code || null;
    }
  } catch (_) { /* not JSON */ }
  return new ApiError(resp.status, message, code);
}

async function api(path, { method = "GET", body, signal } = {}) {
  const resp = await fetch(path, {
    method, signal, headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!resp.ok) throw await errorFrom(resp);
  return resp.status === 204 ? null : resp.json();
}

// Server-sent events from a fetch body: yields each event's data string.
async function* sseData(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let m;
    while ((m = /\r?\n\r?\n/.exec(buf))) {
      const block = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) yield data;
    }
  }
}

function randomHex(n) {
  const bytes = crypto.getRandomValues(new Uint8Array(n / 2));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// ---------------------------------------------------------------- banner and status

function showBanner(text, kind = "error") {
  const b = $("banner");
  b.textContent = text;
  b.dataset.kind = kind;
  b.hidden = false;
  clearTimeout(showBanner.timer);
  if (kind !== "error") showBanner.timer = setTimeout(() => (b.hidden = true), 4000);
}

function hideBanner() { $("banner").hidden = true; }

function reportError(e, what) {
  if (e instanceof ApiError && e.status === 401) {
    $("settings").open = true;
    showBanner("This server needs an API key: enter it under Settings.");
    // Only when nothing else has focus: a refusal from a background refresh must not pull
    // the cursor out of the message being typed (Enter would then land in the key field).
    if (!document.activeElement || document.activeElement === document.body) $("api-key").focus();
    return;
  }
  showBanner(`${what}: ${e.message}`);
}

async function checkHealth() {
  const dot = $("health");
  try {
    const r = await fetch("/health");
    const body = await r.json();
    dot.dataset.state = body.status;
    dot.title = "server: " + body.status;
  } catch (_) {
    dot.dataset.state = "down";
    dot.title = "server unreachable";
  }
}

// The model picker: every model the server (or a gateway) can serve, each with its load status
// where the server gives one (loaded, loading, unloaded: a model not loaded is loaded by the
// first request that names it). A session belongs to one model: switching model in an open
// session starts a new chat, and opening a session selects its model.
const sessionModels = {}; // session id -> its model, from GET /v1/sessions

function modelLabel(m) {
  const status = m.status && m.status.value;
  return status ? `${m.id} · ${status}` : m.id;
}

// Whether two names in the list are one model (an alias listed beside its model's id).
function sameModel(a, b) {
  if (a === b) return true;
  const card = (id) => state.models.find((m) => m.id === id) || {};
  const ma = card(a).meta || {}, mb = card(b).meta || {};
  return (ma.path && ma.path === mb.path) || (ma.aliases || []).includes(b) || (mb.aliases || []).includes(a);
}

function selectModel(id) {
  state.model = id;
  $("model-name").textContent = id || "";
  $("model-select").value = id || "";
  store.set("model", id);
}

async function loadModel() {
  try {
    const models = (await api("/v1/models")).data;
    state.models = models;
    const ids = models.map((m) => m.id);
    const wanted = state.model || store.get("model");
    const select = $("model-select");
    select.replaceChildren(...models.map((m) => {
      const option = el("option", null, modelLabel(m));
      option.value = m.id;
      option.dataset.status = (m.status && m.status.value) || "";
      return option;
    }));
    selectModel(ids.includes(wanted) ? wanted : ids[0] || null);
    select.hidden = ids.length < 2; // one model: a plain label
    $("model-name").hidden = !select.hidden;
  } catch (e) {
    if (e.status === 401) reportError(e, "models");
  }
}

function onModelPicked() {
  const id = $("model-select").value;
  const session = state.sessionId;
  selectModel(id);
  if (session && sessionModels[session] && !sameModel(sessionModels[session], id)) newChat();
  loadModel(); // statuses may have changed since the list was read
}

// ---------------------------------------------------------------- titles

const titles = JSON.parse(store.get("titles", "{}")); // session id -> first words, for the sidebar
const parents = JSON.parse(store.get("parents", "{}")); // branch session id -> the session it came from

function rememberTitle(sessionId, text) {
  if (!sessionId || titles[sessionId]) return;
  titles[sessionId] = text.replace(/\s+/g, " ").trim().slice(0, 60);
  store.set("titles", JSON.stringify(titles));
}

// ---------------------------------------------------------------- sessions and snapshots

function sessionLabel(s) {
  return titles[s.session_id] || s.session_id;
}

async function refreshSessions() {
  const list = $("session-list");
  let sessions;
  try {
    sessions = (await api("/v1/sessions")).data;
  } catch (e) {
    if (e.status === 404 || e.status === 405) {
      state.sessionsApi = false;
      $("sessions-note").textContent = "This server keeps no sessions: the chat lives in this tab.";
      $("sessions-note").hidden = false;
      list.replaceChildren();
      updateHeader();
      return;
    }
    if (e.status === 401) reportError(e, "sessions");
    return;
  }
  state.sessionsApi = true;
  $("sessions-note").hidden = true;
  list.replaceChildren(...sessions.map((s) => {
    sessionModels[s.session_id] = s.model;
    const li = el("li", "item");
    li.dataset.sessionId = s.session_id;
    if (s.session_id === state.sessionId) li.classList.add("active");
    if (parents[s.session_id]) li.classList.add("branch");
    const open = el("button", "item-main");
    open.type = "button";
    open.append(el("span", "item-title", sessionLabel(s)),
      el("span", "item-sub", `${s.message_count} msgs · ${s.current_pos} tok${s.busy ? " · busy" : ""}`));
    open.title = s.session_id + (parents[s.session_id] ? `\nbranched from ${parents[s.session_id]}` : "");
    open.addEventListener("click", () => openSession(s.session_id));
    const del = el("button", "icon delete", "×");
    del.type = "button";
    del.title = "delete this session";
    del.addEventListener("click", () => confirmThen(del, () => deleteSession(s.session_id)));
    li.append(open, del);
    return li;
  }));
  if (!sessions.length) list.append(el("li", "hint", "No sessions yet."));
  updateHeader();
  fillTitles(sessions);
}

// Sessions started elsewhere (another browser, the CLI) are named after their first user message.
async function fillTitles(sessions) {
  const unknown = sessions.filter((s) => !titles[s.session_id] && s.message_count > 0).slice(0, 20);
  for (const s of unknown) {
    let history;
    try {
      history = await api(`/v1/sessions/${encodeURIComponent(s.session_id)}/history`);
    } catch (_) {
      continue;
    }
    const first = history.data.find((m) => m.role === "user");
    if (!first) continue;
    rememberTitle(s.session_id, contentText(first.content));
    const label = document.querySelector(`#session-list [data-session-id="${CSS.escape(s.session_id)}"] .item-title`);
    if (label) label.textContent = titles[s.session_id];
  }
  updateHeader();
}

// A destructive button asks once more inline instead of through a modal.
function confirmThen(button, action) {
  if (button.dataset.armed) {
    action();
    return;
  }
  button.dataset.armed = "1";
  button.textContent = "delete?";
  setTimeout(() => {
    delete button.dataset.armed;
    button.textContent = "×";
  }, 3000);
}

async function deleteSession(id) {
  try {
    await api(`/v1/sessions/${encodeURIComponent(id)}`, { method: "DELETE" });
  } catch (e) {
    reportError(e, "delete");
    return;
  }
  delete titles[id];
  store.set("titles", JSON.stringify(titles));
  if (id === state.sessionId) newChat();
  refreshSessions();
}

async function openSession(id) {
  if (state.running) return;
  let history;
  try {
    history = await api(`/v1/sessions/${encodeURIComponent(id)}/history`);
  } catch (e) {
    reportError(e, "open session");
    return;
  }
  state.sessionId = id;
  store.set("session", id);
  const model = sessionModels[id];
  if (model && state.models.some((m) => m.id === model) && !sameModel(model, state.model)) selectModel(model);
  clearMessages();
  history.data.forEach((m, i) => {
    if (m.role === "user" && !titles[id]) rememberTitle(id, contentText(m.content));
    addMessage(m, i);
  });
  state.count = history.data.length;
  markLast();
  refreshSessions();
  closeSidebarOnNarrow();
}

function newChat() {
  if (state.running) return;
  state.sessionId = null;
  state.local = [];
  state.count = 0;
  store.set("session", "");
  clearMessages();
  updateHeader();
  document.querySelectorAll("#session-list .item").forEach((li) => li.classList.remove("active"));
  $("prompt").focus();
}

function updateHeader() {
  $("session-title").textContent = state.sessionId ? (titles[state.sessionId] || state.sessionId) : "New chat";
  $("save-snapshot").disabled = !(state.sessionsApi && state.sessionId) || !!state.running;
}

async function refreshSnapshots() {
  const list = $("snapshot-list");
  if (state.sessionsApi === false) {
    list.replaceChildren(el("li", "hint", "Not available on this server."));
    return;
  }
  let snaps;
  try {
    snaps = (await api("/v1/snapshots")).data;
  } catch (e) {
    list.replaceChildren(el("li", "hint", e.status === 404 ? "Not available on this server." : e.message));
    return;
  }
  list.replaceChildren(...snaps.map((s) => {
    const li = el("li", "item");
    li.dataset.snapshotId = s.snapshot_id;
    const info = el("div", "item-main static");
    const when = new Date(s.created_at * 1000).toLocaleString([], { dateStyle: "short", timeStyle: "short" });
    info.append(el("span", "item-title", s.title || "untitled"),
      el("span", "item-sub", `${s.session.n_tokens} tok · ${when}`));
    info.title = `${s.snapshot_id}\nfrom session ${s.session.session_id}` + (s.tags.length ? `\ntags: ${s.tags.join(", ")}` : "");
    const load = el("button", "small load", "Load");
    load.type = "button";
    load.title = "load into a new session";
    load.addEventListener("click", () => loadSnapshot(s));
    li.append(info, load);
    return li;
  }));
  if (!snaps.length) list.append(el("li", "hint", "None saved yet."));
}

async function loadSnapshot(snap) {
  if (state.running) return;
  const base = snap.session.session_id.slice(0, 100);
  const sessionId = `${base}-${randomHex(6)}`;
  let session;
  try {
    session = await api(`/v1/snapshots/${snap.snapshot_id}/load`, { method: "POST", body: { session_id: sessionId } });
  } catch (e) {
    reportError(e, "load snapshot");
    return;
  }
  titles[session.session_id] = (snap.title || titles[snap.session.session_id] || session.session_id) + " ↺";
  store.set("titles", JSON.stringify(titles));
  await openSession(session.session_id);
  showBanner(`Loaded snapshot “${snap.title || snap.snapshot_id}” into a new session.`, "info");
}

function openSaveDialog() {
  if (!state.sessionId) return;
  $("snapshot-title").value = titles[state.sessionId] || "";
  $("snapshot-tags").value = "";
  $("save-dialog").showModal();
}

async function saveSnapshot() {
  const tags = $("snapshot-tags").value.split(",").map((t) => t.trim()).filter(Boolean);
  try {
    const snap = await api(`/v1/sessions/${encodeURIComponent(state.sessionId)}/save`, {
      method: "POST", body: { title: $("snapshot-title").value.trim(), tags },
    });
    showBanner(`Saved snapshot “${snap.title || snap.snapshot_id}”.`, "info");
  } catch (e) {
    reportError(e, "save snapshot");
  }
  refreshSnapshots();
}

// ---------------------------------------------------------------- a turn

function setRunning(running) {
  const b = $("send");
  b.dataset.state = running ? "stop" : "send";
  b.textContent = running ? "Stop" : "Send";
  b.disabled = false;
  b.classList.toggle("danger", running);
  $("new-chat").disabled = running;
  updateHeader();
}

function numberSetting(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

async function ensureSession() {
  if (state.sessionsApi === null) await refreshSessions();
  if (!state.sessionsApi || state.sessionId) return;
  const s = await api("/v1/sessions", { method: "POST", body: state.model ? { model: state.model } : {} });
  sessionModels[s.session_id] = s.model;
  state.sessionId = s.session_id;
  store.set("session", s.session_id);
}

async function sendTurn(text) {
  hideBanner();
  const turn = { cancelId: "web_" + randomHex(24), controller: new AbortController(), stopping: false };
  state.running = turn;
  setRunning(true);
  const fresh = state.sessionId ? false : state.local.length === 0;
  const system = $("system").value.trim();
  const base = state.count;
  const sent = [];
  if (system && fresh) sent.push({ role: "system", content: system });
  sent.push({ role: "user", content: text });
  // Until the server has the turn these are the places it will take in the transcript.
  sent.forEach((m, i) => addMessage(m, base + i));
  const view = new ReplyView();
  view.msg.dataset.index = base + sent.length;
  markLast();
  const t = { start: performance.now(), first: null, end: null, ttft: null, usage: null };
  let finish = null;
  try {
    await ensureSession();
    rememberTitle(state.sessionId, text);
    updateHeader();
    const messages = state.sessionsApi ? [...sent] : [...state.local, ...sent];
    const body = {
      messages, stream: true, stream_options: { include_usage: true }, cancel_id: turn.cancelId,
    };
    if (state.model) body.model = state.model;
    if (state.sessionsApi) body.session_id = state.sessionId;
    const maxTokens = numberSetting("max-tokens");
    if (maxTokens) body.max_tokens = maxTokens;
    const temperature = numberSetting("temperature");
    if (temperature !== undefined) body.temperature = temperature;

    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: turn.controller.signal,
    });
    if (!resp.ok) throw await errorFrom(resp);
    loadModel(); // a model that was not loaded shows as loading now, while the reply waits for it
    for await (const data of sseData(resp)) {
      if (data === "[DONE]") break;
      const ev = JSON.parse(data);
      if (ev.error) {
        view.error(ev.error.message || "generation failed");
        finish = finish || "error";
        continue;
      }
      for (const ch of ev.choices || []) {
        const d = ch.delta || {};
        const piece = d.content || "";
        const thought = d.reasoning_content || "";
        if ((piece || thought || d.tool_calls) && t.first == null) {
          t.first = performance.now();
          t.ttft = t.first - t.start;
        }
        if (piece || thought) view.add(piece, thought);
        if (d.tool_calls) view.addToolCalls(d.tool_calls);
        if (ch.finish_reason) finish = ch.finish_reason;
      }
      if (ev.usage) t.usage = ev.usage;
    }
    if (!state.sessionsApi) {
      const reply = { role: "assistant", content: view.text };
      if (view.calls.length) reply.tool_calls = view.calls.filter(Boolean);
      state.local.push(...sent, reply);
    }
  } catch (e) {
    if (e.name === "AbortError") {
      finish = "cancelled";
    } else {
      view.error(e.message);
      finish = finish || "error";
      if (e instanceof ApiError && e.status === 401) reportError(e, "chat");
    }
  } finally {
    t.end = performance.now();
    view.finish(finish, formatStats(t));
    await syncCount(base, base + sent.length + 1);
    if (state.running === turn) state.running = null;
    setRunning(false);
    markLast();
    if (state.sessionsApi) refreshSessions();
    loadModel(); // the model this turn used is loaded now (and another may have been unloaded)
  }
}

// After a turn: how many messages the transcript holds now. A turn the server never took (an
// error before the stream) leaves it at `base`, and the messages on the page keep the places
// they would have had, so Retry sends them again. Anything else (a reply with tool rounds, a
// session changed elsewhere) is read back from the server's history.
async function syncCount(base, expected) {
  if (!state.sessionsApi) {
    state.count = state.local.length;
    return;
  }
  if (!state.sessionId) return;
  let count;
  try {
    count = (await api(`/v1/sessions/${encodeURIComponent(state.sessionId)}`)).message_count;
  } catch (_) {
    return;
  }
  if (count === expected || count === base) {
    state.count = count;
    return;
  }
  state.running = null;
  await openSession(state.sessionId);
}

async function stopTurn() {
  const turn = state.running;
  if (!turn || turn.stopping) return;
  turn.stopping = true;
  const b = $("send");
  b.textContent = "Stopping…";
  b.disabled = true;
  try {
    await api("/v1/cancel", { method: "POST", body: { cancel_id: turn.cancelId } });
  } catch (_) {
    turn.controller.abort(); // closing the stream cancels the run too
  }
  // The stream ends with finish_reason "cancelled" within an engine step; if it does not, let go.
  setTimeout(() => { if (state.running === turn) turn.controller.abort(); }, 5000);
}

// ---------------------------------------------------------------- wiring

function closeSidebarOnNarrow() {
  if (window.matchMedia("(max-width: 760px)").matches) document.body.classList.remove("sidebar-open");
}

function autosize() {
  const p = $("prompt");
  p.style.height = "auto";
  p.style.height = Math.min(p.scrollHeight, 240) + "px";
}

function bindSetting(id, key) {
  const input = $(id);
  input.value = store.get(key);
  input.addEventListener("change", () => store.set(key, input.value.trim()));
}

function init() {
  bindSetting("api-key", "apiKey");
  bindSetting("max-tokens", "maxTokens");
  bindSetting("temperature", "temperature");
  bindSetting("system", "system");
  $("api-key").addEventListener("change", () => {
    hideBanner();
    loadModel();
    refreshSessions().then(refreshSnapshots);
  });
  $("show-key").addEventListener("click", () => {
    const k = $("api-key");
    k.type = k.type === "password" ? "text" : "password";
    $("show-key").textContent = k.type === "password" ? "show" : "hide";
  });

  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (state.running) {
      stopTurn();
      return;
    }
    const text = $("prompt").value.trim();
    if (!text) return;
    $("prompt").value = "";
    autosize();
    sendTurn(text);
  });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("prompt").addEventListener("input", autosize);
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && state.running) stopTurn();
  });

  $("model-select").addEventListener("change", onModelPicked);
  $("new-chat").addEventListener("click", newChat);
  $("refresh-snapshots").addEventListener("click", refreshSnapshots);
  $("save-snapshot").addEventListener("click", openSaveDialog);
  $("save-dialog").addEventListener("close", () => {
    if ($("save-dialog").returnValue === "save") saveSnapshot();
  });
  $("toggle-sidebar").addEventListener("click", () => document.body.classList.toggle("sidebar-open"));
  $("messages").addEventListener("click", onMessageClick);

  checkHealth();
  setInterval(checkHealth, 15000);
  loadModel();
  refreshSessions().then(async () => {
    const last = store.get("session");
    if (state.sessionsApi && last && document.querySelector(`#session-list [data-session-id="${CSS.escape(last)}"]`)) {
      await openSession(last);
    }
    refreshSnapshots();
  });
  $("prompt").focus();
}

document.addEventListener("DOMContentLoaded", init);
