"""Models loaded on demand, in-process on scripted fake runners: every servable model listed with
its status, a request loading its model, --models-max unloading the least recently used, a
request's keep_alive, POST /models/load and /models/unload (admin key), a failed load naming
the model while the others serve, a cancel during a load, and a session whose KV outlives its
model's unload."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from hearth.api.app import create_app
from hearth.api.context import node_of
from hearth.backends.base import ModelCard
from hearth.backends.local.backend import LocalBackend
from hearth.backends.local.loader import LoadPolicy
from hearth.backends.local.model import EngineSettings
from hearth.chat.template import ChatTemplate
from hearth.config import Settings
from hearth.models import ModelSpec
from tests.api.conftest import Harness, parse_sse, serve
from tests.fakes import SMOL, ScriptedRunner
from tests.helpers import sample, until


class Factory:
    """A fresh ScriptedRunner per load, answering `<id> here.`; `broken` ids fail to load;
    `gate`, when set, holds every load until it is opened (`loading` is set meanwhile)."""

    def __init__(self) -> None:
        self.loads: list[str] = []
        self.broken: set[str] = set()
        self.gate: threading.Event | None = None
        self.loading = threading.Event()

    def __call__(self, spec: ModelSpec, settings: EngineSettings) -> Any:
        self.loading.set()
        if self.gate is not None:
            assert self.gate.wait(120), "the test never opened the load gate"
        if spec.id in self.broken:
            raise ValueError(f"{spec.path}: not a GGUF file (bad magic)")
        self.loads.append(spec.id)
        runner = ScriptedRunner(n_seq_max=2, n_batch=64)
        runner.answer = f"{spec.id} here.".encode()
        return runner, ModelCard(spec.id, 0, meta={"n_ctx": 2048, "parallel": 2}), ChatTemplate(SMOL)


@contextlib.asynccontextmanager
async def models_server(tmp_path: Path, *ids: str, pinned: tuple[str, ...] = (), max_loaded: int = 4,
                        keep_alive: float = 300.0, **settings: Any) -> AsyncIterator[tuple[Harness, Factory]]:
    factory = Factory()
    specs = []
    for i in ids:
        (tmp_path / f"{i}.gguf").write_bytes(b"fake weights " + i.encode())
        specs.append(ModelSpec(i, tmp_path / f"{i}.gguf"))
    backend = LocalBackend([s for s in specs if s.id in pinned],
                           EngineSettings(parallel=2, batch=64, kv_dir=tmp_path / "kv"), factory,
                           available=specs, policy=LoadPolicy(max_loaded, keep_alive),
                           preload=[] if pinned else [ids[0]])
    async with serve(tmp_path, backend=backend, **settings) as h:
        yield h, factory


def chat(model: str, content: str = "Hi", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}


async def statuses(h: Harness) -> dict[str, str]:
    data = (await h.client.get("/v1/models")).json()["data"]
    return {m["id"]: m["status"]["value"] for m in data}


async def answer(h: Harness, model: str, **extra: Any) -> str:
    r = await h.post("/v1/chat/completions", chat(model, **extra))
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model
    return str(r.json()["choices"][0]["message"]["content"])


async def test_every_model_is_listed_and_a_request_loads_its_own(tmp_path: Path) -> None:
    async with models_server(tmp_path, "alpha", "beta", pinned=("alpha",)) as (h, factory):
        assert factory.loads == ["alpha"] and await statuses(h) == {"alpha": "loaded", "beta": "unloaded"}
        beta = next(m for m in (await h.client.get("/v1/models")).json()["data"] if m["id"] == "beta")
        assert beta["status"]["pinned"] is False and beta["meta"]["size_bytes"] == len(b"fake weights beta")
        assert await answer(h, "beta") == "beta here."
        assert factory.loads == ["alpha", "beta"] and await statuses(h) == {"alpha": "loaded", "beta": "loaded"}
        metrics = (await h.client.get("/metrics")).text
        assert sample(metrics, 'hearth_model_loads_total{model="beta"}') == 1
        assert sample(metrics, 'hearth_model_loaded{model="beta"}') == 1
        assert (await h.post("/v1/chat/completions", chat("gamma"))).status_code == 404


async def test_models_max_one_alternates_and_counts_loads(tmp_path: Path) -> None:
    async with models_server(tmp_path, "alpha", "beta", max_loaded=1) as (h, factory):
        for model in ("alpha", "beta", "alpha", "beta"):
            assert await answer(h, model) == f"{model} here."
            assert [m for m, s in (await statuses(h)).items() if s != "unloaded"] == [model]
        assert factory.loads == ["alpha", "beta", "alpha", "beta"]


async def test_a_burst_for_an_unloaded_model_makes_one_load(tmp_path: Path) -> None:
    async with models_server(tmp_path, "alpha", "beta") as (h, factory):
        factory.gate, factory.loading = threading.Event(), threading.Event()
        burst = [asyncio.create_task(answer(h, "beta", max_tokens=4)) for _ in range(4)]
        assert await asyncio.to_thread(factory.loading.wait, 120)
        assert (await statuses(h))["beta"] == "loading"
        factory.gate.set()
        assert await asyncio.gather(*burst) == ["beta"] * 4
        assert factory.loads == ["alpha", "beta"]


async def test_keep_alive_zero_unloads_after_the_request_and_bad_values_are_400(tmp_path: Path) -> None:
    async with models_server(tmp_path, "alpha", "beta") as (h, _):
        assert await answer(h, "beta", keep_alive=0) == "beta here."
        backend = h.backend
        assert isinstance(backend, LocalBackend)
        await until(lambda: backend.loader.entry("beta").state == "unloaded", "beta to be unloaded")
        assert (await statuses(h))["beta"] == "unloaded"
        r = await h.post("/v1/chat/completions", chat("alpha", keep_alive="soon"))
        assert r.status_code == 400 and r.json()["error"]["param"] == "keep_alive"
        assert await answer(h, "alpha", keep_alive="10m") == "alpha here."
        assert backend.loader.entry("alpha").keep_alive == 600  # "10m", kept from the request's end
        alpha = next(m for m in (await h.client.get("/v1/models")).json()["data"] if m["id"] == "alpha")
        assert 0 < alpha["status"]["expires_in"] <= 600


async def test_load_and_unload_routes_need_the_admin_key(tmp_path: Path) -> None:
    async with models_server(tmp_path, "alpha", "beta", pinned=("alpha",), api_keys=["user"],
                             admin_key="root") as (h, factory):
        user, root = {"Authorization": "Bearer user"}, {"Authorization": "Bearer root"}
        assert (await h.post("/models/load", {"model": "beta"}, headers=user)).status_code == 403
        r = await h.post("/models/load", {"model": "beta", "keep_alive": "1h"}, headers=root)
        assert r.status_code == 200 and r.json()["success"] is True and r.json()["status"]["value"] == "loaded"
        assert factory.loads == ["alpha", "beta"]
        assert (await h.post("/models/unload", {"model": "beta"}, headers=user)).status_code == 403
        r = await h.post("/v1/models/unload", {"model": "beta"}, headers=root)
        assert r.json() == {"success": True, "model": "beta", "unloaded": True}
        r = await h.post("/models/unload", {"model": "beta"}, headers=root)
        assert r.json()["unloaded"] is False
        r = await h.post("/models/unload", {"model": "alpha"}, headers=root)
        assert r.status_code == 409 and r.json()["error"]["code"] == "model_pinned"
        r = await h.post("/models/load", {"model": "nope"}, headers=root)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert (await h.post("/models/load", {}, headers=root)).status_code == 400


async def test_a_failed_load_names_the_model_and_the_others_keep_serving(tmp_path: Path) -> None:
    async with models_server(tmp_path, "alpha", "broken") as (h, factory):
        factory.broken.add("broken")
        r = await h.post("/v1/chat/completions", chat("broken"))
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "model_load_failed" and "'broken'" in err["message"] and "bad magic" in err["message"]
        assert await answer(h, "alpha") == "alpha here."
        listed = next(m for m in (await h.client.get("/v1/models")).json()["data"] if m["id"] == "broken")
        assert listed["status"]["value"] == "unloaded" and "bad magic" in listed["status"]["error"]
        assert (await h.client.get("/health")).status_code == 200
        metrics = (await h.client.get("/metrics")).text
        assert sample(metrics, 'hearth_model_load_failures_total{model="broken"}') == 1


async def test_a_cancel_during_the_load_ends_the_request_and_the_load_completes(tmp_path: Path) -> None:
    async with models_server(tmp_path, "alpha", "beta") as (h, factory):
        factory.gate, factory.loading = threading.Event(), threading.Event()
        task = asyncio.create_task(h.post("/v1/chat/completions", chat("beta", cancel_id="c-load")))
        assert await asyncio.to_thread(factory.loading.wait, 120)
        await until(lambda: len(node_of(h.app).cancels) == 1, "the run to register")
        assert (await h.post("/v1/cancel", {"cancel_id": "c-load"})).json()["cancelled"] == 1
        r = await task
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "cancelled"
        factory.gate.set()
        await until(lambda: factory.loads == ["alpha", "beta"], "the load to finish")
        assert await answer(h, "beta") == "beta here."


async def test_a_session_continues_from_its_kv_after_its_model_was_unloaded(tmp_path: Path) -> None:
    async with models_server(tmp_path, "alpha", "beta") as (h, factory):
        turn = {"model": "beta", "session_id": "s-unload", "temperature": 0,
                "messages": [{"role": "user", "content": "Remember the lantern on the north pier."}]}
        first = await h.post("/v1/chat/completions", turn)
        assert first.status_code == 200, first.text
        prompt = first.json()["usage"]["prompt_tokens"]
        r = await h.post("/models/unload", {"model": "beta"})
        assert r.json()["unloaded"] is True
        assert list((tmp_path / "kv" / "beta").glob("s-unload.kv"))  # written before the unload
        session = (await h.client.get("/v1/sessions/s-unload")).json()
        assert session["residency"] == "disk"
        second = await h.post("/v1/chat/completions", {**turn, "messages": [{"role": "user", "content": "And?"}]})
        assert second.status_code == 200, second.text
        assert factory.loads == ["alpha", "beta", "beta"]
        assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt


async def test_a_stream_waits_for_its_model_inside_the_response(tmp_path: Path) -> None:
    async with models_server(tmp_path, "alpha", "beta", "broken") as (h, factory):
        factory.broken.add("broken")
        events = await h.sse("/v1/chat/completions", chat("beta"))
        assert events[0][1]["choices"][0]["delta"]["role"] == "assistant"
        assert "".join(d["choices"][0]["delta"].get("content") or "" for _, d in events[:-1] if d["choices"]) \
            == "beta here."
        assert events[-1] == (None, "[DONE]")
        # a failed load after the status line went out: the stream's own error event
        r = await h.post("/v1/chat/completions", {**chat("broken"), "stream": True})
        assert r.status_code == 200
        errors = [d["error"] for _, d in parse_sse(r.text) if isinstance(d, dict) and "error" in d]
        assert len(errors) == 1 and "model_load_failed" in errors[0]["message"] and "'broken'" in errors[0]["message"]
        # Anthropic's stream too
        r = await h.post("/v1/messages", {**chat("broken"), "max_tokens": 8, "stream": True})
        assert r.status_code == 200 and "model_load_failed" in r.text


async def test_each_protocols_stream_for_an_unloaded_model_opens_once_and_answers(tmp_path: Path) -> None:
    """The opening event is sent before the load (runs.opened_later) and not again when the
    backend's stream starts; the answer and its totals follow in the same stream. (Mid-load
    reads, with the load held, are in tests/e2e/test_models_on_demand.py: this transport
    hands over a response only when it ends.)"""
    async with models_server(tmp_path, "alpha", "beta", max_loaded=1) as (h, factory):
        events = await h.sse("/v1/chat/completions", chat("beta", stream_options={"include_usage": True}))
        roles = [d for _, d in events if d != "[DONE]" and d["choices"] and "role" in d["choices"][0]["delta"]]
        assert len(roles) == 1 and events[-1] == (None, "[DONE]")
        assert events[-2][1]["usage"]["prompt_tokens"] > 0  # the totals count the prompt

        await answer(h, "alpha")  # --models-max 1: beta unloaded
        events = await h.sse("/v1/completions", {"model": "beta", "prompt": "Hi", "max_tokens": 8})
        chunks = [d for _, d in events if d != "[DONE]"]
        assert chunks[0]["choices"] == [{"index": 0, "text": "", "logprobs": None, "finish_reason": None}]
        assert sum(c["choices"] == chunks[0]["choices"] for c in chunks) == 1  # opened once
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"])  # beta's tokens
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")

        await answer(h, "alpha")
        events = await h.sse("/v1/messages", {**chat("beta"), "max_tokens": 8})
        names = [e for e, _ in events]
        assert names.count("message_start") == 1 and names[0] == "message_start" and names[-1] == "message_stop"
        delta = next(d for e, d in events if e == "message_delta")
        assert delta["usage"]["input_tokens"] > 0  # message_start went out before the prompt was read

        await answer(h, "alpha")
        events = await h.sse("/v1/responses", {"model": "beta", "input": "Hi", "max_output_tokens": 64})
        names = [e for e, _ in events]
        assert names.count("response.created") == 1 and names[0] == "response.created"
        assert names[-1] in ("response.completed", "response.incomplete")  # the scripted runner's length
        assert "".join(d["delta"] for e, d in events if e == "response.output_text.delta")  # beta's tokens
        assert factory.loads == ["alpha", "beta", "alpha", "beta", "alpha", "beta", "alpha", "beta"]


@contextlib.asynccontextmanager
async def starting(tmp_path: Path) -> AsyncIterator[tuple[Harness, Factory, asyncio.Task[None]]]:
    """The app on a backend whose start-up load (of `alpha`, named at start) is held by the
    factory's gate: the port is open, as the app's lifespan opens it, while `start` runs."""
    factory = Factory()
    factory.gate = threading.Event()
    (tmp_path / "alpha.gguf").write_bytes(b"fake weights alpha")
    backend = LocalBackend([ModelSpec("alpha", tmp_path / "alpha.gguf")],
                           EngineSettings(parallel=2, batch=64, kv_dir=tmp_path / "kv"), factory)
    app = create_app(backend, Settings(data_dir=tmp_path))
    started = asyncio.create_task(backend.start())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://hearth.test", timeout=30) as client:
            assert await asyncio.to_thread(factory.loading.wait, 30)
            yield Harness(app, backend, None, client), factory, started
    finally:
        factory.gate.set()
        await started
        await node_of(app).background.shutdown()
        await backend.stop()
        node_of(app).sessions.close()


async def test_a_request_during_the_start_up_load_waits_for_it(tmp_path: Path) -> None:
    async with starting(tmp_path) as (h, factory, started):
        health = await h.client.get("/health")
        assert (health.status_code, health.json()) == (503, {"status": "loading"})
        waiting = asyncio.create_task(h.post("/v1/chat/completions", chat("alpha", cancel_id="w")))
        streaming = asyncio.create_task(h.sse("/v1/chat/completions", chat("alpha")))
        await until(lambda: len(node_of(h.app).cancels) == 2, "both runs to register")
        assert not waiting.done() and not streaming.done()  # neither was refused: both wait
        assert (await h.client.get("/health")).status_code == 503  # loading until the model is ready
        assert factory.gate is not None
        factory.gate.set()
        await started
        r = await waiting
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "alpha here."
        events = await streaming  # its status line and role chunk went out during the load
        roles = [d for _, d in events if d != "[DONE]" and d["choices"] and "role" in d["choices"][0]["delta"]]
        assert len(roles) == 1 and events[-1] == (None, "[DONE]")
        assert "".join(d["choices"][0]["delta"].get("content") or "" for _, d in events[:-1]
                       if d["choices"]) == "alpha here."
        assert (await h.client.get("/health")).json() == {"status": "ok"}
        assert factory.loads == ["alpha"]  # one load, the start-up's


async def test_a_cancel_during_the_start_up_load_ends_the_request(tmp_path: Path) -> None:
    async with starting(tmp_path) as (h, factory, started):
        task = asyncio.create_task(h.post("/v1/chat/completions", chat("alpha", cancel_id="c-start")))
        await until(lambda: len(node_of(h.app).cancels) == 1, "the run to register")
        assert (await h.post("/v1/cancel", {"cancel_id": "c-start"})).json()["cancelled"] == 1
        r = await task
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "cancelled"
        assert (await h.client.get("/health")).status_code == 503
        assert factory.gate is not None
        factory.gate.set()
        await started
        assert await answer(h, "alpha") == "alpha here."


async def test_a_failed_start_up_load_is_a_503_for_the_requests_that_waited_and_after(tmp_path: Path) -> None:
    async with starting(tmp_path) as (h, factory, started):
        factory.broken.add("alpha")
        waiting = asyncio.create_task(h.post("/v1/chat/completions", chat("alpha")))
        await until(lambda: len(node_of(h.app).cancels) == 1, "the run to register")
        assert factory.gate is not None
        factory.gate.set()
        await started
        r = await waiting
        assert r.status_code == 503 and "'alpha'" in r.json()["error"]["message"]
        r = await h.post("/v1/chat/completions", chat("alpha"))
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
        assert (await h.client.get("/health")).json()["status"] == "error"
