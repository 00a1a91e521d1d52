"""The chat page (`GET /`) driven in headless chromium against real servers with the real model."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, sample, wait_until
from tests.web.conftest import API_KEY
from tests.web.page import chat_bodies, last_reply, send, stats_numbers, wait_done

pytestmark = pytest.mark.slow

# At temperature 0 the default model writes far more than the few seconds these tests wait.
LONG_PROMPT = "Write a very long story about a dragon and a knight, with many chapters."
# Records the last reply's text length (characters received, as painted: rendered markdown can
# shrink while it streams, `**bo` becoming bold) at every DOM change while it streams.
WATCH_GROWTH = """() => {
  window.__growth = [];
  const box = document.getElementById('messages');
  new MutationObserver(() => {
    const msgs = box.querySelectorAll('.msg.assistant');
    const last = msgs[msgs.length - 1];
    if (last && last.classList.contains('streaming') && last.dataset.chars)
      window.__growth.push([performance.now(), Number(last.dataset.chars)]);
  }).observe(box, {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def wait_idle(server: Server, key: str | None = None, timeout: float = 120) -> dict[str, float]:
    """The server's run gauges once nothing runs (failing if that never happens)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    names = ("hearth_running_sequences", "hearth_cancel_registry_runs", "hearth_waiting_requests")
    values: dict[str, float] = {}

    def idle() -> bool:
        text = httpx.get(f"{server.url}/metrics", headers=headers, timeout=10).text
        values.update({name: sample(text, name) for name in names})
        return all(v == 0 for v in values.values())

    wait_until(idle, "the server to go idle", timeout)
    return values


def cancel_calls(server: Server) -> float:
    """hearth_cancellations_total{cause="cancel_call"}, 0 before the first (the series appears then)."""
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith('hearth_cancellations_total{cause="cancel_call"} '):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# ------------------------------------------------------------------------ serving


def test_static_files_are_served_without_a_key_and_nothing_else(keyed_server: Server) -> None:
    url = keyed_server.url
    page = httpx.get(url + "/", timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script src="/web/app.js"' in page.text and "http://" not in page.text and "https://" not in page.text
    for name in ["app.js", "render.js", "messages.js", "edits.js", "style.css", "index.html",
                 "vendor/marked.umd.js", "vendor/purify.min.js", "vendor/highlight.min.js",
                 "vendor/hljs-github.min.css", "vendor/hljs-github-dark.min.css"]:
        kind = {"js": "text/javascript", "css": "text/css", "html": "text/html"}[name.rsplit(".", 1)[1]]
        r = httpx.get(f"{url}/web/{name}", timeout=10)
        assert r.status_code == 200, name
        assert r.headers["content-type"].startswith(kind)
        assert "default-src 'self'" in r.headers["content-security-policy"]
        # Every script and stylesheet the page loads is one of these: nothing from elsewhere.
        assert f'"/web/{name}"' in page.text or name == "index.html", name
    assert len(re.findall(r'(?:src|href)="([^"]+)"', page.text)) == 10
    etag = httpx.get(url + "/web/app.js", timeout=10).headers["etag"]
    assert httpx.get(url + "/web/app.js", headers={"if-none-match": etag}, timeout=10).status_code == 304
    for path in ["/web/__init__.py", "/web/..%2F__init__.py", "/web/../api/web.py", "/web/%2e%2e/config.py",
                 "/web/", "/web/app.js/x", "/web/vendor/", "/web/vendor/VERSIONS.md", "/web/vendor/LICENSE.marked",
                 "/web/vendor/%2e%2e/app.js", "/web/vendor/..%2F..%2Fapi/web.py"]:
        r = httpx.get(url + path, timeout=10)
        # 404 from the allow-list; 401 where the client normalized `..` away (then it is not /web/).
        assert r.status_code in (401, 404), path
        assert "import" not in r.text
    # Everything else still needs the key.
    assert httpx.get(url + "/v1/models", timeout=10).status_code == 401
    assert httpx.post(url + "/v1/cancel", json={"cancel_id": "x"}, timeout=10).status_code == 401


# ------------------------------------------------------------------------ streaming and Stop


def test_reply_streams_in_with_stats(web_server: Server, new_page: Callable[..., Any]) -> None:
    """The page paints at most once a frame, so how many steps a reply grows in depends on how
    the stream's bytes reach it: a fast server can deliver a short reply in one or two reads.
    The browser's own network throttling (DevTools) spreads this reply's ~13 kB of SSE over
    seconds, so it arrives in many reads on any machine."""
    page = new_page(web_server, max_tokens=64, temperature=0)  # greedy: a reply that runs to max_tokens
    bodies = chat_bodies(page)
    page.evaluate(WATCH_GROWTH)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions",
             {"offline": False, "latency": 0, "downloadThroughput": 4000, "uploadThroughput": -1})
    send(page, "Write a short poem about a warm hearth.")
    wait_done(page)
    cdp.send("Network.emulateNetworkConditions",
             {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})

    growth = page.evaluate("window.__growth")
    lengths = [n for _, n in growth]
    distinct = sorted(set(lengths))
    assert len(distinct) >= 3, f"the reply did not grow in steps while streaming: {lengths}"
    assert lengths == sorted(lengths), "the streamed text only grows"
    assert growth[-1][0] > growth[0][0]
    reply = last_reply(page)
    final = reply.evaluate("m => m.hearthText")
    assert len(final) >= distinct[-1] > distinct[0]

    body = bodies[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 64 and body["messages"][-1]["content"].startswith("Write a short poem")
    assert re.fullmatch(r"web_[0-9a-f]{24}", body["cancel_id"])

    stats = reply.locator(".stats").inner_text()
    assert re.search(r"TTFT \d+(\.\d+)? (ms|s)", stats), stats
    assert re.search(r"\d+\.\d tok/s", stats), stats
    numbers = stats_numbers(page)
    assert numbers["prompt"] > 0 and 0 < numbers["completion"] <= 64
    assert reply.get_attribute("data-finish") in ("stop", "length")
    assert page.errors == []

    # A second turn gets its own cancel_id.
    send(page, "Thanks!")
    wait_done(page)
    assert bodies[-1]["cancel_id"] != body["cancel_id"]
    assert page.locator(".msg.assistant").count() == 2


def test_stop_ends_the_run(web_server: Server, new_page: Callable[..., Any]) -> None:
    page = new_page(web_server, max_tokens=3000, temperature=0)
    bodies = chat_bodies(page)
    cancelled_before = cancel_calls(web_server)
    send(page, LONG_PROMPT)
    reply = last_reply(page)
    page.wait_for_function(
        "() => { const m = [...document.querySelectorAll('.msg.assistant')].pop();"
        " return m.querySelector('.content').innerText.length > 40; }", timeout=60_000)
    assert page.inner_text("#send") == "Stop"
    with page.expect_response(lambda r: r.url.endswith("/v1/cancel")) as cancel:
        page.click("#send")
    assert cancel.value.status == 200
    assert cancel.value.request.post_data_json == {"cancel_id": bodies[-1]["cancel_id"]}
    # No wall-clock bound (speed): that the server ended the stream is proven below, by the
    # "cancelled" finish and the usage only the server's last chunk carries.
    wait_done(page)
    assert page.inner_text("#send") == "Send"

    assert reply.get_attribute("data-finish") == "cancelled"
    assert "cancelled" in reply.locator(".badge.finish").inner_text()
    assert stats_numbers(page)["completion"] < 3000
    text = reply.locator(".content").inner_text()
    time.sleep(1.0)
    assert reply.locator(".content").inner_text() == text, "no text arrives after Stop"

    idle = wait_idle(web_server)
    assert idle["hearth_running_sequences"] == 0 and idle["hearth_cancel_registry_runs"] == 0, idle
    assert cancel_calls(web_server) == cancelled_before + 1
    # A fresh request is served at once: nothing is still generating in a slot.
    r = httpx.post(f"{web_server.url}/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert page.errors == []


# ------------------------------------------------------------------------ API keys


def test_page_works_with_an_api_key(keyed_server: Server, new_page: Callable[..., Any]) -> None:
    page = new_page(keyed_server, wait_ready=False)
    page.wait_for_selector("#banner:not([hidden])")
    assert "API key" in page.inner_text("#banner")
    assert page.locator("#settings").evaluate("d => d.open")

    page.fill("#api-key", API_KEY)
    page.dispatch_event("#api-key", "change")
    page.wait_for_function("() => document.getElementById('model-name').textContent !== ''")
    assert page.locator("#banner").is_hidden()
    for selector, value in [("#max-tokens", "2000"), ("#temperature", "0")]:
        page.fill(selector, value)
        page.dispatch_event(selector, "change")

    auth: list[str | None] = []
    page.on("request", lambda r: auth.append(r.headers.get("authorization")) if "/v1/" in r.url else None)
    send(page, LONG_PROMPT)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.msg.assistant')].pop().querySelector('.content').innerText.length > 20",
        timeout=60_000)
    with page.expect_response(lambda r: r.url.endswith("/v1/cancel")) as cancel:
        page.click("#send")
    assert cancel.value.status == 200 and cancel.value.json()["cancelled"] == 1
    wait_done(page)
    assert last_reply(page).get_attribute("data-finish") == "cancelled"
    assert auth and all(a == f"Bearer {API_KEY}" for a in auth), auth
    idle = wait_idle(keyed_server, key=API_KEY)
    assert idle["hearth_running_sequences"] == 0, idle

    # The key is kept in the browser: a reload needs no typing.
    page.reload()
    page.wait_for_function("() => document.getElementById('model-name').textContent !== ''")
    assert page.input_value("#api-key") == API_KEY
    assert page.locator("#banner").is_hidden()
    assert page.errors == []


def test_a_wrong_key_is_reported_on_the_page(keyed_server: Server, new_page: Callable[..., Any]) -> None:
    page = new_page(keyed_server, key="not-the-key", wait_ready=False)
    page.wait_for_selector("#banner:not([hidden])")  # the page's own start-up calls were refused
    page.fill("#prompt", "hello")
    page.press("#prompt", "Enter")
    page.wait_for_selector(".msg.assistant .error", timeout=90_000)
    wait_done(page)
    assert "invalid API key" in last_reply(page).locator(".error").inner_text()
    assert "API key" in page.inner_text("#banner")


# ------------------------------------------------------------------------ sessions and snapshots


def test_sessions_sidebar_snapshots(web_server: Server, new_page: Callable[..., Any]) -> None:
    # A session started elsewhere is listed under its first user message.
    r = httpx.post(f"{web_server.url}/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "Hello from the API."}], "max_tokens": 4, "session_id": "api-made"})
    assert r.status_code == 200
    page = new_page(web_server, max_tokens=24, temperature=0)
    page.fill("#system", "You are a friendly assistant.")
    n = len(httpx.get(f"{web_server.url}/v1/sessions", timeout=10).json()["data"])  # earlier tests' sessions too
    page.wait_for_function(f"() => document.querySelectorAll('#session-list .item').length === {n}")
    page.locator('#session-list .item[data-session-id="api-made"] .item-title',
                 has_text="Hello from the API.").wait_for()
    bodies = chat_bodies(page)
    send(page, "My name is Ada. Say hello to me.")
    wait_done(page)
    page.wait_for_function(f"() => document.querySelectorAll('#session-list .item').length === {n + 1}")
    first_id = page.locator("#session-list .item.active").get_attribute("data-session-id")
    assert page.locator("#session-list .item").first.get_attribute("data-session-id") == first_id, "newest first"
    assert bodies[-1]["session_id"] == first_id
    assert bodies[-1]["messages"] == [{"role": "system", "content": "You are a friendly assistant."},
                                      {"role": "user", "content": "My name is Ada. Say hello to me."}]
    assert page.inner_text("#session-title") == "My name is Ada. Say hello to me."

    send(page, "What is my name?")
    wait_done(page)
    assert bodies[-1]["session_id"] == first_id
    assert bodies[-1]["messages"] == [{"role": "user", "content": "What is my name?"}], "only the new message is sent"
    assert stats_numbers(page)["cached"] > 0, "the session's KV is reused"
    replies = [r.inner_text() for r in page.locator(".msg.assistant .content").all()]
    raw = page.eval_on_selector_all(".msg.assistant", "ms => ms.map(m => m.hearthText)")

    # A second chat, then back to the first: its history comes from the server.
    page.click("#new-chat")
    assert page.locator(".msg").count() == 0
    send(page, "Tell me a fact about owls.")
    wait_done(page)
    page.wait_for_function(f"() => document.querySelectorAll('#session-list .item').length === {n + 2}")
    second_id = page.locator("#session-list .item.active").get_attribute("data-session-id")
    assert second_id != first_id

    page.click(f'#session-list .item[data-session-id="{first_id}"] .item-main')
    page.wait_for_function("() => document.querySelectorAll('.msg.user').length === 2")
    assert page.locator(".msg.system .content").inner_text() == "You are a friendly assistant."
    assert [u.inner_text() for u in page.locator(".msg.user .content").all()] == [
        "My name is Ada. Say hello to me.", "What is my name?"]
    assert [r.inner_text() for r in page.locator(".msg.assistant .content").all()] == replies
    history = httpx.get(f"{web_server.url}/v1/sessions/{first_id}/history", timeout=10).json()["data"]
    assert [m["content"] for m in history if m["role"] == "assistant"] == raw

    # Save as snapshot, load it into a new session.
    page.click("#save-snapshot")
    page.fill("#snapshot-title", "web test snapshot")
    page.fill("#snapshot-tags", "web, test")
    page.click("#save-confirm")
    snap_item = page.locator("#snapshot-list .item", has_text="web test snapshot")
    snap_item.wait_for()
    snaps = httpx.get(f"{web_server.url}/v1/snapshots", timeout=10).json()["data"]
    saved = next(s for s in snaps if s["title"] == "web test snapshot")
    assert saved["session"]["session_id"] == first_id and saved["tags"] == ["web", "test"]

    snap_item.locator(".load").click()
    page.wait_for_function(f"() => document.querySelectorAll('#session-list .item').length === {n + 3}")
    loaded_id = page.locator("#session-list .item.active").get_attribute("data-session-id")
    assert loaded_id not in (first_id, second_id)
    page.wait_for_function("() => document.querySelectorAll('.msg.user').length === 2")
    assert [r.inner_text() for r in page.locator(".msg.assistant .content").all()] == replies
    send(page, "And what was my name again?")
    wait_done(page)
    assert bodies[-1]["session_id"] == loaded_id
    assert stats_numbers(page)["cached"] > 0, "a loaded snapshot resumes from its KV"

    # Delete the loaded session (the button asks once more).
    row = page.locator(f'#session-list .item[data-session-id="{loaded_id}"]')
    row.hover()
    row.locator(".delete").click()
    row.locator(".delete").click()
    page.wait_for_function(f"() => document.querySelectorAll('#session-list .item').length === {n + 2}")
    assert httpx.get(f"{web_server.url}/v1/sessions/{loaded_id}", timeout=10).status_code == 404
    assert page.inner_text("#session-title") == "New chat"
    assert page.errors == []


def test_page_keeps_the_chat_in_the_tab_without_sessions(web_server: Server, browser: Any) -> None:
    """A server without the sessions API (its GET /v1/sessions answered 404 here): the page says
    so, keeps the conversation itself and sends it whole each turn, to the real server."""
    ctx = browser.new_context()
    try:
        ctx.route("**/v1/sessions", lambda route: route.fulfill(status=404, content_type="application/json", body=(
            '{"error": {"message": "Unknown endpoint", "type": "not_found_error", "param": null, "code": null}}')))
        page = ctx.new_page()
        page.goto(web_server.url + "/")
        page.wait_for_selector("#sessions-note:not([hidden])")
        assert "no sessions" in page.inner_text("#sessions-note")
        page.click("#settings summary")
        page.fill("#max-tokens", "16")
        bodies = chat_bodies(page)
        # What the page sends back is the text it received, read here from the stream itself: the
        # rendered text differs for some replies (code fences, a last newline), and this reply is
        # sampled (the page sends no temperature), so comparing with the rendering would flip.
        with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as first:
            send(page, "Remember the word 'ember'.")
            wait_done(page)
        first_reply = "".join(
            c["delta"].get("content") or "" for line in first.value.text().splitlines()
            if line.startswith("data: {") for c in json.loads(line[6:])["choices"])
        send(page, "Which word?")
        wait_done(page)
        assert all("session_id" not in b for b in bodies)
        assert bodies[-1]["messages"] == [{"role": "user", "content": "Remember the word 'ember'."},
                                          {"role": "assistant", "content": first_reply},
                                          {"role": "user", "content": "Which word?"}]
        assert page.locator(".msg.assistant .stats").count() == 2
        assert page.is_disabled("#save-snapshot")

        # Retry and Edit cut the conversation the tab keeps (there is no Branch without sessions).
        turns = page.locator(".msg.assistant")
        turns.last.hover()
        with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/v1/chat/completions")):
            turns.last.locator(".retry").click()
        wait_done(page)
        assert bodies[-1]["messages"] == [{"role": "user", "content": "Remember the word 'ember'."},
                                          {"role": "assistant", "content": first_reply},
                                          {"role": "user", "content": "Which word?"}], "the question again, alone"
        first = page.locator(".msg.user").first
        first.hover()
        first.locator(".edit").click()
        assert first.locator(".edit-branch").is_hidden()
        first.locator(".edit-text").fill("Remember the word 'hearth'.")
        with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/v1/chat/completions")):
            first.locator(".edit-send").click()
        wait_done(page)
        assert bodies[-1]["messages"] == [{"role": "user", "content": "Remember the word 'hearth'."}]
        assert page.locator(".msg.user").count() == 1 and page.locator(".msg.assistant").count() == 1
    finally:
        ctx.close()


# ------------------------------------------------------------------------ the screenshot in docs/


def test_screenshot_for_the_docs(web_server: Server, new_page: Callable[..., Any], tmp_path: Path) -> None:
    """A finished turn, a stopped one, the sidebar. Also written to $HEARTH_WEB_SCREENSHOT when set:
    `HEARTH_WEB_SCREENSHOT=docs/web-chat.png pytest tests/web -k screenshot` refreshes the docs' image."""
    page = new_page(web_server, max_tokens=80, temperature=0)
    send(page, "Name three primary colors, briefly.")
    wait_done(page)
    page.fill("#max-tokens", "1000")
    send(page, "Now write a long poem about a warm hearth in winter.")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.msg.assistant')].pop().querySelector('.content').innerText.length > 160",
        timeout=60_000)
    page.click("#send")
    wait_done(page)
    page.click("#save-snapshot")
    page.fill("#snapshot-title", "colors and a poem")
    page.click("#save-confirm")
    page.locator("#snapshot-list .item", has_text="colors and a poem").wait_for()
    page.wait_for_selector("#banner:not([hidden])")
    page.locator("#prompt").blur()
    assert page.locator(".msg.assistant .stats").count() == 2
    assert last_reply(page).get_attribute("data-finish") == "cancelled"
    out = tmp_path / "web-chat.png"
    page.screenshot(path=str(out))
    assert out.stat().st_size > 10_000
    target = os.environ.get("HEARTH_WEB_SCREENSHOT")
    if target:
        Path(target).write_bytes(out.read_bytes())


# ------------------------------------------------------------------------ models


def test_several_models_get_a_picker(web_server: Server, browser: Any) -> None:
    """The list is this server's models and its default model again under its alias `default`,
    which the server answers to as well."""
    ctx = browser.new_context()
    try:
        real = httpx.get(f"{web_server.url}/v1/models", timeout=10).json()
        listed = {**real, "data": [*real["data"], {**real["data"][0], "id": "default"}]}
        ctx.route("**/v1/models", lambda route: route.fulfill(json=listed))
        page = ctx.new_page()
        page.goto(web_server.url + "/")
        page.wait_for_selector("#model-select:not([hidden])")
        # every model the server can serve (loaded or loaded on request), then the alias
        options = page.locator("#model-select option")
        assert options.evaluate_all("os => os.map(o => o.value)") == [*(m["id"] for m in real["data"]), "default"]
        assert options.all_inner_texts()[-1] == f"default · {real['data'][0]['status']['value']}"  # with its status
        page.select_option("#model-select", "default")
        page.click("#settings summary")
        page.fill("#max-tokens", "4")
        bodies = chat_bodies(page)
        send(page, "Say hi.")
        wait_done(page)
        assert bodies[-1]["model"] == "default"
        assert last_reply(page).get_attribute("data-finish") in ("stop", "length")
        page.reload()  # the choice is remembered
        page.wait_for_selector("#model-select:not([hidden])")
        assert page.input_value("#model-select") == "default"
    finally:
        ctx.close()


# ------------------------------------------------------------------------ reasoning


def test_reasoning_is_shown_collapsed(web_server: Server, new_page: Callable[..., Any]) -> None:
    """The default model does not think, so this one reply is played from a recorded-shape stream."""
    page = new_page(web_server)
    base = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m", "usage": None}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"reasoning_content": "The user greets; "}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"reasoning_content": "greet back."}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "Hello!"}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**base, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21,
                                          "prompt_tokens_details": {"cached_tokens": 3}}},
    ]
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"content-type": "text/event-stream"}, body=sse))
    send(page, "Hi")
    wait_done(page)
    reply = last_reply(page)
    details = reply.locator("details.reasoning")
    assert details.is_visible() and not details.evaluate("d => d.open"), "reasoning is shown, collapsed"
    assert details.locator(".reasoning-text").text_content() == "The user greets; greet back."
    assert reply.locator(".content").inner_text() == "Hello!"
    details.locator("summary").click()
    assert details.locator(".reasoning-text").inner_text() == "The user greets; greet back."
    assert stats_numbers(page) == {"prompt": 12, "cached": 3, "completion": 9}
    assert page.errors == []
