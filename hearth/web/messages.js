// The conversation's DOM: one element per transcript message, and the reply being streamed.
//
// Each message element keeps its raw text (`msg.hearthText`, what Copy copies and Edit starts
// from) and, once the server holds it, its position in the session's transcript (`data-index`,
// the number that rollback's keep_messages counts). Assistant text is markdown rendered by
// render.js; user, system and tool text is shown as typed. The action buttons carry no handlers
// of their own: app.js listens on #messages and dispatches on their class.
"use strict";

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}

function contentText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => p.text || "").join("");
  return "";
}

function nearBottom() {
  const m = $("messages");
  return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
}

function scrollDown(force = false) {
  const m = $("messages");
  if (force || nearBottom()) m.scrollTop = m.scrollHeight;
}

function clearMessages() {
  $("messages").replaceChildren($("empty"));
  $("empty").hidden = false;
}

const ROLE_LABELS = { user: "You", assistant: "Hearth", system: "System", tool: "Tool result" };

function actionButton(cls, label, title) {
  const b = el("button", `act ${cls}`, label);
  b.type = "button";
  b.title = title;
  return b;
}

// `message`: {role, content, reasoning_content?, tool_calls?, tool_call_id?, name?}, as in a
// session's history; `index`: its place in the transcript (null while the server has not got it).
function addMessage(message, index = null) {
  $("empty").hidden = true;
  const role = message.role;
  const text = contentText(message.content);
  const msg = el("div", `msg ${role}`);
  msg.hearthText = text;
  if (index != null) msg.dataset.index = index;
  let label = ROLE_LABELS[role] || role;
  if (role === "tool" && (message.name || message.tool_call_id)) label += ` · ${message.name || message.tool_call_id}`;
  msg.append(el("div", "role", label));
  const details = el("details", "reasoning");
  details.append(el("summary", null, "Thought"), el("div", "reasoning-text"));
  details.hidden = !message.reasoning_content;
  details.lastChild.textContent = message.reasoning_content || "";
  const body = el("div", "content");
  if (role === "assistant") HearthMarkdown.render(body, text);
  else if (role === "tool") body.append(toolResult(text));
  else if (text) body.append(el("div", "text", text));
  msg.append(details, body);
  if (message.tool_calls && message.tool_calls.length) msg.append(toolCalls(message.tool_calls));
  msg.append(el("div", "meta"), messageActions(role));
  $("messages").append(msg);
  scrollDown(true);
  return msg;
}

function messageActions(role) {
  const row = el("div", "msg-actions");
  if (role === "assistant") {
    row.append(actionButton("copy-answer", "Copy", "copy this answer (markdown)"),
      actionButton("retry", "Retry", "regenerate this answer"));
  } else if (role === "user") {
    row.append(actionButton("edit", "Edit", "edit this message and regenerate from here"));
  }
  return row;
}

// Tool calls are shown as calls: the function's name and its arguments as (pretty) JSON, never
// as answer text. Arguments are text here, not markdown.
function toolCalls(calls) {
  const box = el("div", "tool-calls");
  for (const call of calls) {
    const fn = call.function || {};
    const item = el("div", "tool-call");
    item.dataset.callId = call.id || "";
    const head = el("div", "tool-head");
    head.append(el("span", "tool-kind", "Tool call"), el("code", "tool-name", fn.name || "?"));
    let args = fn.arguments || "";
    try {
      args = JSON.stringify(JSON.parse(args), null, 2);
    } catch (_) { /* partial or not JSON: shown as sent */ }
    const pre = el("pre", "tool-args");
    pre.append(el("code", null, args));
    item.append(head, pre);
    box.append(item);
  }
  return box;
}

function toolResult(text) {
  const details = el("details", "tool-result");
  const lines = text.split("\n").length;
  details.open = lines <= 12 && text.length <= 1200; // long results start folded
  details.append(el("summary", null, `${lines} line${lines === 1 ? "" : "s"}`));
  const pre = el("pre");
  pre.append(el("code", null, text));
  details.append(pre);
  return details;
}

// One assistant reply being streamed; painted at most once a frame (render.js keeps the cost
// of a paint to the block being written).
class ReplyView {
  constructor() {
    this.msg = addMessage({ role: "assistant", content: "" });
    this.msg.classList.add("streaming");
    this.stream = new HearthMarkdown.MarkdownStream(this.msg.querySelector(".content"));
    this.text = "";
    this.reasoning = "";
    this.calls = []; // tool calls streamed as deltas, by index
    this.pending = false;
    this.finished = false;
  }

  add(text, reasoning) {
    this.text += text;
    this.reasoning += reasoning;
    if (text) this.stream.append(text);
    this.schedule();
  }

  addToolCalls(deltas) {
    for (const d of deltas) {
      const i = d.index ?? this.calls.length;
      const call = this.calls[i] || (this.calls[i] = { id: "", type: "function", function: { name: "", arguments: "" } });
      if (d.id) call.id = d.id;
      if (d.function) {
        if (d.function.name) call.function.name += d.function.name;
        if (d.function.arguments) call.function.arguments += d.function.arguments;
      }
    }
    this.schedule();
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => this.paint());
  }

  paint() {
    this.pending = false;
    if (this.finished) return; // a frame queued before the stream ended
    const stick = nearBottom();
    const details = this.msg.querySelector(".reasoning");
    if (this.reasoning) {
      details.hidden = false;
      details.querySelector(".reasoning-text").textContent = this.reasoning;
      details.querySelector("summary").textContent = this.text ? "Thought" : "Thinking…";
    }
    this.stream.paint();
    this.paintToolCalls();
    this.msg.hearthText = this.text;
    this.msg.dataset.chars = this.text.length;
    if (stick) scrollDown(true);
  }

  paintToolCalls() {
    const old = this.msg.querySelector(".tool-calls");
    if (!this.calls.length) return;
    const box = toolCalls(this.calls.filter(Boolean));
    if (old) old.replaceWith(box);
    else this.msg.querySelector(".content").after(box);
  }

  error(message) {
    this.msg.querySelector(".meta").before(el("div", "error", message));
  }

  finish(finishReason, stats) {
    this.finished = true;
    const details = this.msg.querySelector(".reasoning");
    if (this.reasoning) {
      details.hidden = false;
      details.querySelector(".reasoning-text").textContent = this.reasoning;
      details.querySelector("summary").textContent = "Thought";
    }
    this.stream.finish();
    this.paintToolCalls();
    this.msg.hearthText = this.text;
    this.msg.dataset.chars = this.text.length;
    this.msg.classList.remove("streaming");
    this.msg.dataset.finish = finishReason || "";
    const meta = this.msg.querySelector(".meta");
    meta.replaceChildren();
    const labels = { cancelled: "stopped · cancelled", length: "max tokens reached", error: "error" };
    const reason = finishReason || "incomplete"; // the stream ended without saying why
    if (!finishReason) labels.incomplete = "ended without a finish";
    if (labels[reason]) meta.append(el("span", `badge finish is-${reason}`, labels[reason]));
    if (stats) meta.append(el("span", "stats", stats));
    if (!this.text && !this.reasoning && !this.calls.length && finishReason === "cancelled") {
      this.msg.querySelector(".content").append(el("div", "text muted", "(stopped before any text)"));
    }
  }
}

function formatStats(t) {
  const parts = [];
  if (t.ttft != null) parts.push(`TTFT ${t.ttft < 1000 ? Math.round(t.ttft) + " ms" : (t.ttft / 1000).toFixed(2) + " s"}`);
  const u = t.usage;
  if (u) {
    const gen = (t.end - (t.first ?? t.end)) / 1000;
    if (u.completion_tokens > 1 && gen > 0) parts.push(`${((u.completion_tokens - 1) / gen).toFixed(1)} tok/s`);
    const cached = (u.prompt_tokens_details && u.prompt_tokens_details.cached_tokens) || 0;
    parts.push(`prompt ${u.prompt_tokens}`, `cached ${cached}`, `completion ${u.completion_tokens}`);
  }
  return parts.join(" · ");
}

// ---------------------------------------------------------------- copying

// navigator.clipboard exists only in a secure context (https, or http on localhost); a page
// opened over plain http from another machine falls back to a selected textarea and execCommand.
async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = el("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.className = "offscreen";
  document.body.append(area);
  area.select();
  try {
    if (!document.execCommand("copy")) throw new Error("copy refused");
  } finally {
    area.remove();
  }
}

async function copyFrom(button, text) {
  const label = button.textContent;
  try {
    await copyText(text);
    button.textContent = "Copied";
    button.dataset.copied = "1";
  } catch (_) {
    button.textContent = "Copy failed";
  }
  setTimeout(() => {
    button.textContent = label;
    delete button.dataset.copied;
  }, 1500);
}
