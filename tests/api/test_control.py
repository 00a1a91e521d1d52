"""Models, health, tokenizer endpoints, metrics and the request log, in-process."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from hearth.observability.logging import RequestIdFilter
from tests.api.conftest import Harness
from tests.helpers import sample


async def test_models_and_health(h: Harness) -> None:
    assert (await h.client.get("/health")).json() == {"status": "ok"}
    models = (await h.client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["fake"]
    assert (await h.client.get("/v1/models/fake")).json()["id"] == "fake"
    assert (await h.client.get("/v1/models/nope")).status_code == 404


async def test_tokenize_and_detokenize(h: Harness) -> None:
    r = (await h.post("/tokenize", {"content": "héllo"})).json()
    assert r == {"tokens": list("héllo".encode()), "count": 6}
    pieces = (await h.post("/tokenize", {"content": "ab", "with_pieces": True})).json()["tokens"]
    assert pieces == [{"id": 97, "piece": "a"}, {"id": 98, "piece": "b"}]
    chat = (await h.post("/tokenize", {"messages": [{"role": "user", "content": "hi"}]})).json()
    assert bytes(chat["tokens"]).decode() == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert (await h.post("/detokenize", {"tokens": list(b"hey")})).json() == {"content": "hey"}
    r = await h.post("/detokenize", {"tokens": [999]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


class _WatchedVocab(int):
    """A vocabulary size that records the thread of every range check made against it
    (`t < n_vocab` calls this reflected method first, as it is an int subclass)."""

    threads: list[threading.Thread]

    def __gt__(self, other: object) -> bool:
        self.threads.append(threading.current_thread())
        return int.__gt__(self, other)  # type: ignore[operator]


async def test_token_ids_are_checked_off_the_event_loop(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A million ids take a while to check: never on the loop, where /health would wait."""
    assert h.runner is not None
    vocab = _WatchedVocab(h.runner.n_vocab)
    vocab.threads = []
    monkeypatch.setattr(h.runner, "n_vocab", vocab)
    assert (await h.post("/detokenize", {"tokens": list(b"hey" * 100)})).status_code == 200
    assert len(vocab.threads) == 300 and threading.current_thread() not in vocab.threads


async def test_tokenizing_does_not_hold_the_event_loop(h: Harness) -> None:
    """A tokenize that takes long (held here by the test) leaves /health answering."""
    assert h.runner is not None
    h.runner.hold_tokenize = release = threading.Event()
    slow = asyncio.create_task(h.post("/tokenize", {"content": "x" * 1000}))
    assert await asyncio.to_thread(h.runner.tokenizing.wait, 10)
    health = await asyncio.wait_for(h.client.get("/health"), 10)
    assert health.status_code == 200 and not slow.done()
    release.set()
    assert (await slow).json()["count"] == 1000


async def test_metrics_come_from_the_backends_stats(h: Harness) -> None:
    await h.post("/v1/chat/completions", {"model": "fake", "messages": [{"role": "user", "content": "Hi"}],
                                          "temperature": 0})
    text = (await h.client.get("/metrics")).text
    stats = h.backend.stats()["fake"]
    assert sample(text, 'hearth_generated_tokens_total{model="fake"}') == stats.generated_tokens > 0
    assert sample(text, 'hearth_prompt_tokens_total{model="fake"}') == stats.prompt_tokens > 0
    assert sample(text, 'hearth_kv_tokens{model="fake"}') == stats.kv_tokens
    assert sample(text, 'hearth_http_requests_total{endpoint="/v1/chat/completions",status="200"}') == 1


async def test_every_error_answer_is_logged_with_its_reason_and_request_id(
        h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(RequestIdFilter())
    with caplog.at_level(logging.INFO, logger="hearth.http"):
        r = await h.post("/v1/chat/completions", {"messages": []}, headers={"x-request-id": "req-abc"})
        r2 = await h.post("/v1/messages", {"model": "nope", "max_tokens": 5,
                                           "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r2.status_code == 404
    [line, line2] = [rec for rec in caplog.records if rec.name == "hearth.http"]
    assert line.request_id == "req-abc" == r.headers["x-request-id"]  # type: ignore[attr-defined]
    assert "400" in line.getMessage() and "messages: List should have at least 1 item" in line.getMessage()
    assert line2.request_id == r2.headers["x-request-id"]  # type: ignore[attr-defined]
    assert "404" in line2.getMessage() and "model_not_found" in line2.getMessage()
    assert "The model 'nope' does not exist" in line2.getMessage()
