// Markdown for the chat page: model output to safe DOM, whole or while it streams.
//
// marked (GFM) turns markdown into HTML, DOMPurify sanitizes every piece of it before it reaches
// the document, highlight.js colours finished code blocks. All three are vendored under
// /web/vendor/ (VERSIONS.md there). Model output never runs script: no HTML is inserted that
// DOMPurify has not returned, links open in a new tab with rel="noopener noreferrer", and the
// page's CSP (script-src 'self') is a second wall behind the sanitizer, not the first.
//
// Streaming: `MarkdownStream` keeps the answer as finished blocks plus one open tail. Each paint
// lexes only the tail (the text after the last finished block); every top-level block the lexer
// has seen another block start after is finished: it is rendered once, appended, and never
// touched again. So a long answer costs O(its length) in total, not O(length²), and what is on
// screen never flickers above the block being written. The one thing a finished block cannot
// see is a reference-style link defined further down ([x][1] ... [1]: url): it stays text.
"use strict";

const HearthMarkdown = (() => {
  // breaks: a single newline is a line break, as chat UIs show it: models write poems, addresses
  // and "Red\nBlue\nYellow" with single newlines and mean them.
  const md = new marked.Marked({ gfm: true, breaks: true, async: false });

  // Tags a chat answer has no use for (forms, frames, media, styles) are dropped whole; styles
  // and ids could dress model text up as the page's own controls.
  const PURIFY = {
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option", "iframe", "frame",
      "frameset", "object", "embed", "video", "audio", "source", "track", "dialog", "template", "link", "meta",
      "base"],
    FORBID_ATTR: ["style", "id", "class", "name", "target", "srcset", "action", "formaction"],
    ALLOW_DATA_ATTR: false,
    ADD_ATTR: ["data-lang"], // a code block's language (render.js sets it; harmless from a model)
    RETURN_DOM_FRAGMENT: true,
  };

  // Every link opens in a new tab and tells the target nothing about the page.
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.localName === "a" && (node.hasAttribute("href") || node.hasAttribute("xlink:href"))) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });

  // Code blocks keep their language as a data attribute (class is forbidden on model HTML, so
  // marked's `language-x` class is carried over on our own attribute instead).
  md.use({
    renderer: {
      code({ text, lang }) {
        const language = (lang || "").trim().split(/\s+/)[0];
        const attr = language ? ` data-lang="${escapeAttr(language)}"` : "";
        return `<pre${attr}><code>${escapeText(text)}</code></pre>\n`;
      },
      // Task list boxes as glyphs: the sanitizer drops <input> (no form controls from a model).
      checkbox({ checked }) {
        return `${checked ? "☑" : "☐"} `;
      },
    },
  });

  function escapeText(s) {
    return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function escapeAttr(s) {
    return escapeText(s).replace(/"/g, "&quot;");
  }

  function sanitize(html) {
    return DOMPurify.sanitize(html, PURIFY);
  }

  const stats = { parsedChars: 0, blockRenders: 0, tailRenders: 0 }; // read by tests/web

  function button(cls, label, title) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = cls;
    b.textContent = label;
    b.title = title;
    return b;
  }

  // Our own chrome around a sanitized fragment: code blocks get a header with their language and
  // a copy button (and, when `highlight`, colours), tables a scrolling wrapper.
  function decorate(fragment, highlight) {
    for (const pre of fragment.querySelectorAll("pre")) {
      const box = document.createElement("div");
      box.className = "codeblock";
      const head = document.createElement("div");
      head.className = "code-head";
      const lang = document.createElement("span");
      lang.className = "code-lang";
      lang.textContent = pre.dataset.lang || "text";
      head.append(lang, button("copy copy-code", "Copy", "copy this code"));
      pre.replaceWith(box);
      box.append(head, pre);
      if (highlight) highlightCode(pre);
    }
    for (const table of fragment.querySelectorAll("table")) {
      const wrap = document.createElement("div");
      wrap.className = "table-wrap";
      table.replaceWith(wrap);
      wrap.append(table);
    }
    return fragment;
  }

  // Only a named, known language is highlighted: guessing (highlightAuto) runs every grammar
  // over the block and guesses wrong on short ones. highlight.js escapes the code it returns;
  // that HTML goes through DOMPurify all the same.
  function highlightCode(pre) {
    const lang = pre.dataset.lang;
    const code = pre.querySelector("code");
    if (!code || !lang || typeof hljs === "undefined" || !hljs.getLanguage(lang)) return;
    const html = hljs.highlight(code.textContent, { language: lang, ignoreIllegals: true }).value;
    code.replaceChildren(DOMPurify.sanitize(html, { ...PURIFY, FORBID_ATTR: ["style", "id"], RETURN_DOM_FRAGMENT: true }));
    code.classList.add("hljs");
  }

  function fragmentOf(tokens, links, highlight) {
    const list = tokens.slice();
    list.links = links;
    return decorate(sanitize(md.parser(list)), highlight);
  }

  // The whole text at once (history, a finished answer).
  function render(target, text) {
    const tokens = md.lexer(normalize(text));
    stats.parsedChars += text.length;
    target.replaceChildren(fragmentOf(tokens, tokens.links, true));
  }

  function normalize(text) {
    return text.replace(/\r\n?/g, "\n");
  }

  class MarkdownStream {
    constructor(target) {
      this.target = target;
      this.text = "";
      this.done = 0; // text[0:done] is rendered as finished blocks
      this.tail = document.createElement("div");
      this.tail.className = "md-tail";
      target.replaceChildren(this.tail);
    }

    append(piece) {
      this.text += normalize(piece);
    }

    // Re-render the open tail, first moving any block that is now finished above it.
    paint() {
      const rest = this.text.slice(this.done);
      const tokens = md.lexer(rest);
      stats.parsedChars += rest.length;
      let last = tokens.length - 1;
      while (last > 0 && tokens[last].type === "space") last--;
      if (last > 0) {
        const finished = tokens.slice(0, last);
        this.tail.before(fragmentOf(finished, tokens.links, true));
        stats.blockRenders += finished.filter((t) => t.type !== "space").length;
        this.done += finished.reduce((n, t) => n + t.raw.length, 0);
      }
      this.tail.replaceChildren(fragmentOf(tokens.slice(Math.max(last, 0)), tokens.links, false));
      stats.tailRenders += 1;
    }

    // The answer ended: the tail is rendered as finished (highlighted) and takes its place.
    finish() {
      const rest = this.text.slice(this.done);
      const tokens = md.lexer(rest);
      stats.parsedChars += rest.length;
      stats.blockRenders += tokens.filter((t) => t.type !== "space").length;
      this.tail.replaceWith(fragmentOf(tokens, tokens.links, true));
      this.done = this.text.length;
    }
  }

  return { render, sanitize, MarkdownStream, stats };
})();
