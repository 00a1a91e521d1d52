"""Retry, edit and branch on the chat page, against the real server and its sessions; tool calls
shown as calls. Nothing here reads what the model wrote: only which messages the server's
transcript holds, what the page sent, and the cache counts in the usage."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.helpers import Server
from tests.web.page import chat_bodies, last_reply, send, stats_numbers, wait_done

pytestmark = pytest.mark.slow


def history(server: Server, sid: str) -> list[dict[str, Any]]:
    return list(httpx.get(f"{server.url}/v1/sessions/{sid}/history", timeout=10).json()["data"])


def snapshot_ids(server: Server) -> set[str]:
    return {s["snapshot_id"] for s in httpx.get(f"{server.url}/v1/snapshots", timeout=10).json()["data"]}


def active_session(page: Any) -> str:
    page.wait_for_selector("#session-list .item.active")
    return str(page.locator("#session-list .item.active").get_attribute("data-session-id"))


def two_turns(page: Any, system: str | None = None) -> str:
    if system:
        page.fill("#system", system)
        page.dispatch_event("#system", "change")
    send(page, "Name a fruit.")
    wait_done(page)
    send(page, "Name a color.")
    wait_done(page)
    return active_session(page)


def click_for_turn(page: Any, target: Any) -> None:
    """Click `target` and wait for the turn it starts (after its rollback) to end."""
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/v1/chat/completions")):
        target.click()
    wait_done(page)


def user_texts(page: Any) -> list[str]:
    return [t.strip() for t in page.locator(".msg.user .content").all_inner_texts()]


def test_retry_rolls_back_one_turn_and_regenerates(web_server: Server, new_page: Callable[..., Any]) -> None:
    page = new_page(web_server, max_tokens=12, temperature=0)
    sid = two_turns(page)
    before = history(web_server, sid)
    assert [m["role"] for m in before] == ["user", "assistant", "user", "assistant"]
    bodies = chat_bodies(page)

    answers = page.locator(".msg.assistant")
    assert answers.first.locator(".retry").is_hidden(), "only the newest answer offers Retry"
    answers.last.hover()
    with page.expect_request(lambda r: r.url.endswith(f"/v1/sessions/{sid}/rollback")) as rollback:
        click_for_turn(page, answers.last.locator(".retry"))
    assert rollback.value.post_data_json == {"keep_messages": 2}

    assert bodies[-1]["session_id"] == sid
    assert bodies[-1]["messages"] == [{"role": "user", "content": "Name a color."}], "only the question again"
    after = history(web_server, sid)
    assert [m["role"] for m in after] == ["user", "assistant", "user", "assistant"]
    assert after[:3] == before[:3]
    assert user_texts(page) == ["Name a fruit.", "Name a color."]
    assert page.locator(".msg.assistant").count() == 2
    assert stats_numbers(page)["cached"] > 0, "the first turn's KV is kept through the rollback"
    assert page.errors == []


def test_edit_an_earlier_message_regenerates_from_there(web_server: Server, new_page: Callable[..., Any]) -> None:
    page = new_page(web_server, max_tokens=12, temperature=0)
    sid = two_turns(page, system="Answer in one word.")
    assert [m["role"] for m in history(web_server, sid)] == ["system", "user", "assistant", "user", "assistant"]
    bodies = chat_bodies(page)

    first = page.locator(".msg.user").first
    first.hover()
    first.locator(".edit").click()
    editor = first.locator(".edit-text")
    assert editor.input_value() == "Name a fruit."
    # Cancel leaves everything as it was.
    first.locator(".edit-cancel").click()
    assert first.locator(".editor").count() == 0 and first.locator(".content").is_visible()

    first.hover()
    first.locator(".edit").click()
    first.locator(".edit-text").fill("Name a vegetable.")
    with page.expect_request(lambda r: r.url.endswith(f"/v1/sessions/{sid}/rollback")) as rollback:
        click_for_turn(page, first.locator(".edit-send"))
    assert rollback.value.post_data_json == {"keep_messages": 1}, "the system message stays"

    assert bodies[-1]["messages"] == [{"role": "user", "content": "Name a vegetable."}]
    after = history(web_server, sid)
    assert [(m["role"], m["content"]) for m in after[:2]] == [("system", "Answer in one word."),
                                                              ("user", "Name a vegetable.")]
    assert [m["role"] for m in after] == ["system", "user", "assistant"]
    assert user_texts(page) == ["Name a vegetable."]
    assert stats_numbers(page)["cached"] > 0, "the system message's KV is kept"
    assert page.errors == []


def test_branch_keeps_the_original_and_reuses_the_shared_part(
        web_server: Server, new_page: Callable[..., Any]) -> None:
    page = new_page(web_server, max_tokens=12, temperature=0)
    sid = two_turns(page, system="Answer in one word.")
    original = history(web_server, sid)
    snapshots_before = snapshot_ids(web_server)
    bodies = chat_bodies(page)

    second = page.locator(".msg.user").nth(1)
    second.hover()
    second.locator(".edit").click()
    second.locator(".edit-text").fill("Name an animal.")
    with page.expect_response(lambda r: r.url.endswith("/rollback")) as rollback:
        click_for_turn(page, second.locator(".edit-branch"))
    cut = rollback.value.json()
    branch_id = cut["session_id"]
    assert branch_id != sid and rollback.value.request.post_data_json == {"keep_messages": 3}
    shared = cut["current_pos"]
    assert shared > 0 and cut["message_count"] == 3
    page.wait_for_function("(id) => document.querySelector('#session-list .item.active')?.dataset.sessionId === id",
                           arg=branch_id)

    # The branch: the shared part, then the edit; its first turn prefilled none of the shared part.
    assert bodies[-1]["session_id"] == branch_id
    assert bodies[-1]["messages"] == [{"role": "user", "content": "Name an animal."}]
    assert stats_numbers(page)["cached"] >= shared
    branched = history(web_server, branch_id)
    assert branched[:3] == original[:3]
    assert [(m["role"], m["content"]) for m in branched[3:4]] == [("user", "Name an animal.")]
    assert len(branched) == 5
    assert user_texts(page) == ["Name a fruit.", "Name an animal."]

    # The original is untouched, and both are listed (the branch marked as one).
    assert history(web_server, sid) == original
    page.wait_for_selector(f'#session-list .item.branch[data-session-id="{branch_id}"]')
    assert page.locator(f'#session-list .item[data-session-id="{sid}"]').count() == 1
    # The snapshot that carried the shared part is gone again.
    assert snapshot_ids(web_server) == snapshots_before

    # Back to the original: its own history.
    page.click(f'#session-list .item[data-session-id="{sid}"] .item-main')
    page.wait_for_function("() => [...document.querySelectorAll('.msg.user .content')].map(e => e.innerText.trim())"
                           ".join('|') === 'Name a fruit.|Name a color.'")
    assert page.errors == []


TOOL_HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "**clear**"}'},
    {"role": "assistant", "content": "It is **21 °C** and clear."},
]


def test_tool_calls_and_results_are_shown_as_such(web_server: Server, new_page: Callable[..., Any]) -> None:
    sid = "web-tools"
    r = httpx.post(f"{web_server.url}/v1/sessions", json={"session_id": sid, "messages": TOOL_HISTORY}, timeout=10)
    assert r.status_code == 201, r.text
    page = new_page(web_server)
    page.click(f'#session-list .item[data-session-id="{sid}"] .item-main')
    page.wait_for_selector(".msg.tool")

    call = page.locator(".msg.assistant .tool-call")
    assert call.count() == 1
    assert call.locator(".tool-name").inner_text() == "get_weather"
    assert json.loads(call.locator(".tool-args").inner_text()) == {"city": "Paris", "unit": "c"}
    assert call.locator(".tool-args").inner_text() == '{\n  "city": "Paris",\n  "unit": "c"\n}', "pretty JSON"
    tool = page.locator(".msg.tool")
    assert "call_1" in tool.locator(".role").inner_text()
    # A tool's result is data: shown as sent, not rendered as markdown.
    assert tool.locator(".content pre code").inner_text() == '{"temp": 21, "sky": "**clear**"}'
    assert tool.locator("strong").count() == 0
    assert page.locator(".msg.assistant").last.locator(".content strong").inner_text() == "21 °C"
    assert page.errors == []
    httpx.delete(f"{web_server.url}/v1/sessions/{sid}", timeout=10)


def test_streamed_tool_calls_are_shown_as_calls(web_server: Server, new_page: Callable[..., Any]) -> None:
    page = new_page(web_server)
    base = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m", "usage": None}
    deltas = [
        {"tool_calls": [{"index": 0, "id": "call_9", "type": "function",
                         "function": {"name": "search", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"q": "hea'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'rth"}'}}]},
    ]
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"content-type": "text/event-stream"}, body=body))
    send(page, "Search for hearth.")
    wait_done(page)
    reply = last_reply(page)
    assert reply.get_attribute("data-finish") == "tool_calls"
    assert reply.locator(".tool-call .tool-name").inner_text() == "search"
    assert json.loads(reply.locator(".tool-args").inner_text()) == {"q": "hearth"}
    assert reply.locator(".content").inner_text().strip() == ""
    assert page.errors == []
