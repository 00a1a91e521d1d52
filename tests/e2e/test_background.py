"""Background responses against the real model, through the official openai SDK: polled to the
end, resumed after a disconnect with `starting_after` (every event exactly once), cancelled while
running; and a plain stream is still cancelled by its client leaving."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai import OpenAI

from hearth.models import DEFAULT_MODEL_ID
from tests.e2e.test_http import wait_idle
from tests.helpers import EXACT, Server, wait_until

pytestmark = pytest.mark.slow

PROMPT = "Tell me a long story about a lighthouse keeper."
LONG = {**EXACT, "ignore_eos": True}  # runs to max_output_tokens: seconds, whatever the model writes
RUNNING = {"queued", "in_progress"}


@pytest.fixture(scope="module")
def client(server: Server) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)


def create(client: OpenAI, **kw: Any) -> Any:
    kw.setdefault("max_output_tokens", 40)
    kw.setdefault("extra_body", EXACT)
    return client.responses.create(model=DEFAULT_MODEL_ID, input=PROMPT, temperature=0, **kw)


def poll(client: OpenAI, rid: str) -> Any:
    """The response once it has left queued / in_progress (as OpenAI's guide polls)."""
    seen: list[Any] = []

    def ended() -> bool:
        seen.append(client.responses.retrieve(rid))
        return seen[-1].status not in RUNNING

    wait_until(ended, f"{rid} to end", timeout=300, interval=0.1)
    return seen[-1]


def test_a_background_response_is_polled_to_the_same_answer(client: OpenAI, server: Server) -> None:
    wait_idle(server)
    plain = create(client)
    started = create(client, background=True)
    assert started.background is True and started.status in RUNNING and started.id != plain.id
    done = poll(client, started.id)
    assert done.status == plain.status and done.output_text == plain.output_text  # temperature 0, no cache
    assert done.usage is not None and plain.usage is not None
    assert done.usage.output_tokens == plain.usage.output_tokens
    assert done.background is True


def test_a_client_that_leaves_resumes_with_starting_after_and_gets_every_event_once(
        client: OpenAI, server: Server) -> None:
    wait_idle(server)
    stream = create(client, background=True, stream=True, max_output_tokens=200, extra_body=LONG)
    first: list[Any] = []
    for event in stream:
        first.append(event)
        if len(first) == 6:  # created, in_progress, item added, part added, two deltas
            break
    stream.close()  # the connection goes; the run does not
    rid = first[0].response.id
    resumed = list(client.responses.retrieve(rid, stream=True, starting_after=first[-1].sequence_number))
    assert resumed[-1].type == "response.incomplete"
    final = resumed[-1].response
    # It ran to its end: a disconnect would have cancelled a plain run ("cancelled").
    assert final.incomplete_details is not None and final.incomplete_details.reason == "max_output_tokens"
    assert final.usage is not None and final.usage.output_tokens == 200
    whole = list(client.responses.retrieve(rid, stream=True))  # one uninterrupted read of the same run
    assert [e.model_dump() for e in first + resumed] == [e.model_dump() for e in whole]
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    text = "".join(e.delta for e in whole if e.type == "response.output_text.delta")
    assert text == final.output_text == client.responses.retrieve(rid).output_text
    # The same request, not in the background, writes the same text (temperature 0, no cache).
    plain = create(client, max_output_tokens=200, extra_body=LONG)
    assert plain.output_text == text


def test_cancel_a_running_background_response(client: OpenAI, server: Server) -> None:
    wait_idle(server)
    started = create(client, background=True, max_output_tokens=1500, extra_body=LONG)
    wait_until(lambda: client.responses.retrieve(started.id).status == "in_progress", "the run to be admitted")
    cancelled = client.responses.cancel(started.id)
    assert cancelled.status == "cancelled" and cancelled.background is True
    assert cancelled.usage is not None and cancelled.usage.output_tokens < 1500
    again = client.responses.cancel(started.id)  # idempotent: the final object again
    assert again.model_dump() == cancelled.model_dump()
    assert client.responses.retrieve(started.id).status == "cancelled"
    wait_idle(server)


def test_background_requires_store_and_plain_responses_are_not_streamed_again(server: Server) -> None:
    r = httpx.post(f"{server.base_url}/responses", json={"input": "Hi", "background": True, "store": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"
    plain = httpx.post(f"{server.base_url}/responses", json={"input": "Hi", "max_output_tokens": 4}, timeout=60)
    rid = plain.json()["id"]
    r = httpx.get(f"{server.base_url}/responses/{rid}", params={"stream": "true"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


def test_a_plain_stream_is_still_cancelled_when_its_client_leaves(server: Server) -> None:
    wait_idle(server)
    body = {"input": PROMPT, "max_output_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/responses", json=body, timeout=120) as r:
        rid, deltas = None, 0
        for line in r.iter_lines():
            if rid is None and line.startswith("data: ") and '"response.created"' in line:
                rid = line.split('"id":"', 1)[1].split('"', 1)[0]
            deltas += line.startswith("data: ") and '"response.output_text.delta"' in line
            if deltas == 3:
                break
    assert rid is not None

    def stored() -> dict[str, Any]:
        got: dict[str, Any] = httpx.get(f"{server.base_url}/responses/{rid}").json()
        return got

    wait_until(lambda: stored()["status"] != "in_progress", "the run to stop")
    ended = stored()
    assert ended["status"] == "incomplete" and ended["incomplete_details"] == {"reason": "cancelled"}
    assert ended["usage"]["output_tokens"] < 1500
    wait_idle(server)
