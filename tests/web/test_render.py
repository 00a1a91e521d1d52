"""The chat page renders answers as markdown, safely, and cheaply while they stream.

Every answer here is fixed text (tests/web/markdown_fixtures.py), given to the page's own
renderer or played to it as a stream in place of the model's: nothing depends on what the model
writes. The page is served by a real server all the same, with its real headers."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import Server, wait_until
from tests.web.markdown_fixtures import FEATURES, FEATURES_OUTLINE, HOSTILE, OUTLINE_JS, chunks, long_answer
from tests.web.page import answer_with, last_reply, send, wait_done

pytestmark = pytest.mark.slow


def outline(locator: Any) -> Any:
    return locator.evaluate(OUTLINE_JS)


def render_js(text: str) -> str:
    """JS that renders `text` whole into a fresh element and returns it."""
    return (f"() => {{ const d = document.createElement('div'); HearthMarkdown.render(d, {json.dumps(text)});"
            " return d; }")


def test_every_markdown_feature_renders_to_the_expected_structure(
        web_server: Server, new_page: Callable[..., Any]) -> None:
    page = new_page(web_server)
    whole = page.evaluate_handle(render_js(FEATURES))
    assert whole.evaluate(OUTLINE_JS) == FEATURES_OUTLINE

    # The same answer streamed in 3-character pieces through the page's turn: same structure.
    answer_with(page, chunks(FEATURES, 3))
    send(page, "Show me everything.")
    wait_done(page)
    reply = last_reply(page)
    assert reply.get_attribute("data-finish") == "stop"
    assert outline(reply.locator(".content")) == FEATURES_OUTLINE
    assert reply.evaluate("m => m.hearthText") == FEATURES
    # Colours on the named language only; the plain block stays plain.
    assert reply.locator("pre[data-lang=python] code.hljs span").count() > 3
    assert reply.locator("pre:not([data-lang]) code span").count() == 0
    # A reopened session shows the history through the same renderer (history path = stream path).
    history_view = page.evaluate_handle(
        f"() => addMessage({{role: 'assistant', content: {json.dumps(FEATURES)}}}).querySelector('.content')")
    assert history_view.evaluate(OUTLINE_JS) == FEATURES_OUTLINE
    assert page.errors == []


def test_streaming_renders_each_finished_block_once(web_server: Server, new_page: Callable[..., Any]) -> None:
    """A ~2,000-token answer painted after every 4-character piece (one paint per token, more
    than a real stream gets: the page paints at most once a frame). Finished blocks are rendered
    once; only the open tail is parsed again, so the characters parsed stay within the text plus
    one tail per paint, not the text once per paint. The result equals rendering it whole.

    The per-paint times are printed (`pytest -s`), not asserted: docs/web.md states them."""
    page = new_page(web_server)
    text = long_answer()
    pieces = chunks(text, 4)
    result = page.evaluate("""([pieces, text]) => {
      const before = {...HearthMarkdown.stats};
      const box = document.createElement('div');
      document.getElementById('messages').append(box);
      const stream = new HearthMarkdown.MarkdownStream(box);
      const times = [];
      let maxTail = 0;
      for (const p of pieces) {
        stream.append(p);
        const t0 = performance.now();
        stream.paint();
        times.push(performance.now() - t0);
        maxTail = Math.max(maxTail, stream.text.length - stream.done);
      }
      const t0 = performance.now();
      stream.finish();
      times.push(performance.now() - t0);
      const s = HearthMarkdown.stats;
      const streamed = box.innerHTML;
      const whole = document.createElement('div');
      const w0 = performance.now();
      HearthMarkdown.render(whole, text);
      const wholeMs = performance.now() - w0;
      const blocks = new marked.Marked({gfm: true, breaks: true}).lexer(text).filter((t) => t.type !== 'space');
      return {
        parsed: s.parsedChars - before.parsedChars - text.length, blockRenders: s.blockRenders - before.blockRenders,
        tailRenders: s.tailRenders - before.tailRenders, times, maxTail, same: streamed === whole.innerHTML,
        blocks: blocks.length, maxBlock: Math.max(...blocks.map((t) => t.raw.length)), wholeMs,
      };
    }""", [pieces, text])
    assert result["same"], "the streamed answer renders exactly as the whole text does"
    assert result["blockRenders"] == result["blocks"], "every finished block is rendered once"
    assert result["tailRenders"] == len(pieces)
    # Each paint parses at most the open block and what it finished: bounded by the longest block
    # (plus the newest piece), never by the text so far.
    assert result["maxTail"] <= result["maxBlock"] + 8
    assert result["parsed"] <= len(text) + len(pieces) * (result["maxBlock"] + 8)
    assert result["parsed"] < len(pieces) * len(text) / 20, "far below re-parsing the whole text each paint"

    times = sorted(result["times"])
    print(f"\nstreaming render of {len(text)} chars in {len(pieces)} pieces: per paint median "
          f"{statistics.median(times):.3f} ms, p95 {times[int(len(times) * 0.95)]:.3f} ms, max {times[-1]:.3f} ms; "
          f"the whole text at once {result['wholeMs']:.1f} ms; parsed {result['parsed']} chars in total")


def test_copy_buttons_copy_the_code_and_the_answer(web_server: Server, new_page: Callable[..., Any]) -> None:
    page = new_page(web_server, permissions=["clipboard-read", "clipboard-write"])
    answer_with(page, chunks(FEATURES, 5))
    send(page, "Show me everything.")
    wait_done(page)
    reply = last_reply(page)
    code_buttons = reply.locator(".codeblock .copy-code")
    assert code_buttons.count() == 2, "one copy button on every code block"

    def copies(button: Any, expected: str, what: str) -> None:
        button.click()  # the clipboard is written asynchronously: wait for it, not for a guess
        wait_until(lambda: page.evaluate("navigator.clipboard.readText()") == expected, what, timeout=30)

    copies(code_buttons.first, 'def greet(name: str) -> str:\n    return f"Hello, {name}!"', "the first code block")
    copies(code_buttons.nth(1), "plain block <not a tag>", "the second code block")
    reply.hover()
    copies(reply.locator(".copy-answer"), FEATURES, "the answer, as markdown")
    assert page.locator("text=Copy failed").count() == 0
    assert page.errors == []


# ------------------------------------------------------------------------ hostile markdown

# Run in a context with the page's CSP switched off: the sanitizer alone must hold (the CSP's
# script-src 'self' would otherwise block inline handlers and hide a sanitizer that let them by).
CHECK_SAFE = """(root) => {
  const bad = [];
  const FORBIDDEN = ['script', 'iframe', 'frame', 'object', 'embed', 'form', 'input', 'button:not(.copy-code)',
    'style', 'base', 'meta', 'link', 'noscript', 'video', 'audio', 'source', 'animate', 'set'];
  for (const sel of FORBIDDEN) for (const e of root.querySelectorAll(sel)) bad.push('element ' + sel);
  for (const e of root.querySelectorAll('*')) {
    for (const a of e.attributes) {
      const name = a.name.toLowerCase();
      const value = a.value.replace(/[\\u0000-\\u0020]/g, '').toLowerCase();
      if (name.startsWith('on')) bad.push(`${e.tagName} ${name}`);
      if (name === 'style' || name === 'srcdoc') bad.push(`${e.tagName} ${name}`);
      if (/^(javascript|vbscript|data:text\\/html)/.test(value)) bad.push(`${e.tagName} ${name}=${a.value}`);
    }
    if (e.localName === 'a' && (e.hasAttribute('href') || e.hasAttribute('xlink:href')) &&
        (e.getAttribute('target') !== '_blank' || e.getAttribute('rel') !== 'noopener noreferrer'))
      bad.push('link without target/rel: ' + e.outerHTML);
    for (const cls of ['copy-code', 'msg-actions', 'retry', 'edit', 'copy-answer'])
      if (e.classList.contains(cls) && !e.closest('.code-head')) bad.push('a page control from model text: ' + cls);
  }
  // Fire what a user would: hover, focus, clicks on everything that is not a link out.
  for (const e of root.querySelectorAll('*')) {
    for (const type of ['mouseover', 'mouseenter', 'focus', 'toggle', 'load', 'error', 'animationstart'])
      e.dispatchEvent(new Event(type));
    if (e.localName !== 'a') e.dispatchEvent(new MouseEvent('click', {bubbles: true}));
  }
  return bad;
}"""
PWN_JS = "() => { window.__pwned = []; window.PWN = (n) => window.__pwned.push(n); }"
# A trusted image whose error handler sets a flag: once it has fired, the images the hostile
# answers held (had any kept its handler) have failed too.
SENTINEL_JS = """() => { const i = document.createElement('img'); i.onerror = () => { window.__sentinel = true; };
  i.src = '/web/no-such-image-' + Math.random() + '.png'; document.body.append(i); }"""


def test_hostile_markdown_never_runs_script(web_server: Server, new_page: Callable[..., Any]) -> None:
    page = new_page(web_server, bypass_csp=True)
    page.evaluate(PWN_JS)
    # The check can fail: the same answers put into the page raw (no sanitizer) do run script.
    page.evaluate("""(html) => { const d = document.createElement('div'); d.innerHTML = html;
      document.body.append(d); d.querySelector('div').dispatchEvent(new Event('mouseover')); d.remove(); }""",
                  HOSTILE["style-and-hover"] + HOSTILE["details-ontoggle"])
    page.wait_for_function("() => window.__pwned.length > 0")
    page.evaluate(PWN_JS)

    problems: dict[str, list[str]] = {}
    for name, answer in HOSTILE.items():
        # Whole (a session's history) and streamed in 2-character pieces (split tags and all).
        shown = page.evaluate_handle(
            f"() => addMessage({{role: 'assistant', content: {json.dumps(answer)}}}).querySelector('.content')")
        bad = shown.evaluate(CHECK_SAFE)
        streamed = page.evaluate_handle(f"""() => {{
          const d = document.createElement('div'); document.getElementById('messages').append(d);
          const s = new HearthMarkdown.MarkdownStream(d);
          for (const p of {json.dumps(chunks(answer, 2))}) {{ s.append(p); s.paint(); }}
          s.finish(); return d; }}""")
        bad += streamed.evaluate(CHECK_SAFE)
        if bad:
            problems[name] = bad
    assert problems == {}

    # Through a real turn too: the stream is read and painted by the page itself.
    answer_with(page, chunks("".join(HOSTILE.values()), 7))
    send(page, "Be evil.")
    wait_done(page)
    assert last_reply(page).locator(".content").evaluate(CHECK_SAFE) == []

    page.evaluate(SENTINEL_JS)
    page.wait_for_function("() => window.__sentinel === true")
    assert page.evaluate("window.__pwned") == [], "model output ran script"
    assert page.url == web_server.url + "/", "model output navigated the page"
    # Code shows hostile HTML as text.
    code = page.locator(".msg.assistant pre[data-lang=html] code").first.text_content()
    assert code == "<script>PWN('code')</script>"
    assert page.errors == []
