// Retry, edit and branch: going back in a conversation.
//
// The server's sessions make all three cheap. Retry and edit roll the session back
// (POST /v1/sessions/{id}/rollback keeps the first N messages and cuts the KV to match), then
// send the user message again, so only the new text is prefilled. Branch keeps the original
// session untouched: it saves the session as a snapshot, loads that into a new session, rolls
// the new one back to the shared part, and sends the edited message there; the new session's KV
// already holds the shared part, so its first turn reports it as cached (zero re-prefill). The
// snapshot is only the vehicle and is deleted afterwards (where the key may; an --admin-key
// server keeps it, tagged "branch"). Without the sessions API, retry and edit cut the
// conversation the tab keeps, and there is no branching.
"use strict";

// Only the newest answer offers Retry: retrying an older one would throw away the turns after it
// (Edit on its question says so more plainly).
function markLast() {
  const answers = document.querySelectorAll("#messages .msg.assistant");
  answers.forEach((m, i) => m.classList.toggle("last", i === answers.length - 1));
}

// Keep the first `keep` messages of the open conversation, on the server and on the page.
async function rollbackTo(keep) {
  if (state.sessionsApi && state.sessionId && keep < state.count) {
    const s = await api(`/v1/sessions/${encodeURIComponent(state.sessionId)}/rollback`,
      { method: "POST", body: { keep_messages: keep } });
    state.count = s.message_count;
  } else if (!state.sessionsApi) {
    state.local = state.local.slice(0, keep);
    state.count = state.local.length;
  }
  const msgs = [...document.querySelectorAll("#messages .msg")];
  const first = msgs.findIndex((m) => m.dataset.index === undefined || Number(m.dataset.index) >= keep);
  if (first >= 0) msgs.slice(first).forEach((m) => m.remove());
  if (!document.querySelector("#messages .msg")) $("empty").hidden = false;
}

function questionOf(answer) {
  let m = answer.previousElementSibling;
  while (m && !m.classList.contains("user")) m = m.previousElementSibling;
  return m;
}

async function retry(answer) {
  const question = questionOf(answer);
  if (state.running || !question || question.dataset.index === undefined) return;
  try {
    await rollbackTo(Number(question.dataset.index));
  } catch (e) {
    reportError(e, "retry");
    return;
  }
  sendTurn(question.hearthText);
}

function openEditor(question) {
  if (state.running || question.querySelector(".editor") || question.dataset.index === undefined) return;
  const content = question.querySelector(".content");
  const editor = el("div", "editor");
  const area = el("textarea", "edit-text");
  area.value = question.hearthText;
  area.rows = Math.min(12, Math.max(2, area.value.split("\n").length));
  const row = el("div", "actions");
  const cancel = actionButton("edit-cancel ghost", "Cancel", "keep the message as it was");
  const branch = actionButton("edit-branch ghost", "Branch", "keep this conversation and continue the edit in a new session");
  branch.hidden = !(state.sessionsApi && state.sessionId);
  const send = actionButton("edit-send primary", "Send", "replace this message and regenerate from here");
  row.append(cancel, branch, send);
  editor.append(area, row);
  content.hidden = true;
  content.after(editor);
  area.focus();
  area.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      send.click();
    } else if (ev.key === "Escape") {
      ev.stopPropagation();
      cancel.click();
    }
  });
}

function closeEditor(question) {
  const editor = question.querySelector(".editor");
  if (editor) editor.remove();
  question.querySelector(".content").hidden = false;
}

async function submitEdit(question, asBranch) {
  const text = question.querySelector(".edit-text").value.trim();
  if (state.running || !text) return;
  const keep = Number(question.dataset.index);
  let reused = null;
  try {
    if (asBranch) reused = await branchAt(keep);
    else await rollbackTo(keep);
  } catch (e) {
    reportError(e, asBranch ? "branch" : "edit");
    return;
  }
  await sendTurn(text);
  if (asBranch) showBanner(`Branched into a new session: ${reused} tokens of the shared part were reused; the original is kept.`, "info");
}

// A new session holding the open one's first `keep` messages and their KV; it becomes the open
// session, and the original stays as it was. Returns how many KV tokens it starts with.
async function branchAt(keep) {
  const parent = state.sessionId;
  const enc = encodeURIComponent;
  const label = titles[parent] || parent;
  const snap = await api(`/v1/sessions/${enc(parent)}/save`,
    { method: "POST", body: { title: `branch point: ${label}`.slice(0, 200), tags: ["branch"] } });
  const id = `${parent.slice(0, 100)}-b${randomHex(6)}`;
  try {
    await api(`/v1/snapshots/${snap.snapshot_id}/load`, { method: "POST", body: { session_id: id } });
  } finally {
    api(`/v1/snapshots/${snap.snapshot_id}`, { method: "DELETE" }).catch(() => {}).finally(refreshSnapshots);
  }
  const cut = await api(`/v1/sessions/${enc(id)}/rollback`, { method: "POST", body: { keep_messages: keep } });
  titles[id] = ("↳ " + label).slice(0, 60);
  parents[id] = parent;
  store.set("titles", JSON.stringify(titles));
  store.set("parents", JSON.stringify(parents));
  await openSession(id);
  return cut.current_pos;
}

// The buttons on messages and code blocks, all handled here (no handler on any rendered node).
function onMessageClick(ev) {
  const button = ev.target.closest("button");
  if (!button) return;
  const msg = button.closest(".msg");
  if (button.classList.contains("copy-code")) {
    copyFrom(button, button.closest(".codeblock").querySelector("pre code").textContent);
  } else if (!msg) {
    return;
  } else if (button.classList.contains("copy-answer")) {
    copyFrom(button, msg.hearthText || "");
  } else if (button.classList.contains("retry")) {
    retry(msg);
  } else if (button.classList.contains("edit")) {
    openEditor(msg);
  } else if (button.classList.contains("edit-cancel")) {
    closeEditor(msg);
  } else if (button.classList.contains("edit-send")) {
    submitEdit(msg, false);
  } else if (button.classList.contains("edit-branch")) {
    submitEdit(msg, true);
  }
}
