"""Ollama's native API on a real Hearth server with the real default model, through the official
`ollama` Python client: every endpoint, streamed and not, errors as the client raises them, a
disconnect that stops the engine work, and the delete refusals (a --models-dir file beside the
embedded default)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import pytest

from hearth import catalog
from hearth.models import DEFAULT_MODEL_ID, embedded_model_path
from tests.helpers import Server, start_server, stop_server

pytestmark = pytest.mark.slow

OPTIONS = {"temperature": 0, "num_predict": 24}
HI = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Its own server: these tests unload its model and name a --models-dir file."""
    tmp = tmp_path_factory.mktemp("ollama")
    models = tmp / "models"
    models.mkdir()
    link = models / "local-copy.gguf"
    try:  # a second name for the default's file (a link, not a 100 MB copy); its own id
        os.link(embedded_model_path(), link)
    except OSError:
        link.write_bytes(embedded_model_path().read_bytes())
    s = start_server(tmp, "--parallel", "2", "--ctx", "2048", "--models-dir", str(models), "--max-wait", "600")
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[ollama.Client]:
    c = ollama.Client(host=server.url, timeout=600)  # a deadline, not speed
    yield c
    c._client.close()


def test_list_show_version(client: ollama.Client) -> None:
    listed = {m.model: m for m in client.list().models}
    default = listed[f"{DEFAULT_MODEL_ID}:latest"]
    assert "local-copy:latest" in listed
    assert default.details is not None and default.details.format == "gguf"
    assert default.details.family == "llama" and default.details.quantization_level == "Q4_1"
    assert default.size == embedded_model_path().stat().st_size and default.digest and default.modified_at
    shown = client.show("smollm2:latest")  # an alias, with Ollama's tag
    assert shown.capabilities == ["completion"] and shown.template and "im_start" in shown.template
    assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "llama"
    assert client._client.get("/api/version").json()["version"].count(".") == 2


def test_chat_whole_and_streamed(client: ollama.Client) -> None:
    r = client.chat(model="smollm2", messages=HI, options=OPTIONS)
    assert r.done and r.done_reason in ("stop", "length") and r.message.role == "assistant"
    assert r.message.content and r.eval_count and r.prompt_eval_count and r.model == "smollm2:latest"
    assert r.total_duration and r.eval_duration and r.prompt_eval_duration is not None
    parts = list(client.chat(model="smollm2", messages=HI, options=OPTIONS, stream=True))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts).strip()


def test_generate_whole_and_streamed(client: ollama.Client) -> None:
    r = client.generate(model=DEFAULT_MODEL_ID, prompt="Name a color.", system="Answer in one word.",
                        options=OPTIONS)
    assert r.done and r.response and r.eval_count
    parts = list(client.generate(model=DEFAULT_MODEL_ID, prompt="Once upon a time", raw=True,
                                 options={"temperature": 0, "num_predict": 5}, stream=True))
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 5


def _post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={**body, "cache_prompt": False}, timeout=600)


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/api/chat", {"messages": HI}, lambda ln: ln["message"]["content"]),
    ("/api/generate", {"prompt": "Write a haiku about the sea."}, lambda ln: ln["response"]),
])
def test_streamed_ndjson_equals_the_whole_answer_at_temperature_0(server: Server, path: str, body: dict[str, Any],
                                                                 field: Any) -> None:
    """Both recompute the whole prompt (cache_prompt false, Hearth's field): llama.cpp's kernels are
    not batch-invariant, and a cached prefix may move the logits' last bits (docs/api.md)."""
    base = {"model": DEFAULT_MODEL_ID, "options": {"temperature": 0, "num_predict": 48}, **body}
    whole = _post(server, path, {**base, "stream": False}).json()
    r = _post(server, path, base)
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(ln) for ln in r.text.splitlines()]
    assert "".join(field(ln) for ln in lines) == field(whole)
    assert (lines[-1]["done_reason"], lines[-1]["eval_count"]) == (whole["done_reason"], whole["eval_count"])


def test_format_takes_the_structured_path(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}
    r = client.chat(model="smollm2", messages=HI, format=schema, options={"temperature": 0, "num_predict": 64})
    assert set(json.loads(r.message.content or "")) == {"capital"}
    r = client.generate(model="smollm2", prompt="Give a JSON object.", format="json",
                        options={"temperature": 0, "num_predict": 16})
    assert r.response.startswith("{")  # the grammar's first token (the tiny model may not close it in 16)


def test_ps_keep_alive_and_an_unload(client: ollama.Client) -> None:
    client.generate(model="smollm2", keep_alive="10m")  # an empty request: a load
    [loaded] = [m for m in client.ps().models if m.model == f"{DEFAULT_MODEL_ID}:latest"]
    assert loaded.size_vram == 0 and loaded.expires_at is not None and loaded.size
    r = client.generate(model="smollm2", keep_alive=0)
    assert r.done_reason == "unload"
    assert f"{DEFAULT_MODEL_ID}:latest" not in [m.model for m in client.ps().models]
    assert client.chat(model="smollm2", messages=HI, options=OPTIONS).done  # loaded again on demand


def test_pull(client: ollama.Client) -> None:
    assert client.pull("smollm2").status == "success"  # served already: at once
    coder = catalog.CATALOG["qwen2.5-coder-0.5b"]
    if catalog.installed_path(coder).is_file():  # installed by scripts/setup_agents.sh (never downloaded here)
        steps = list(client.pull("qwen2.5-coder-0.5b:latest", stream=True))
        assert [s.status for s in steps][-1] == "success"
        assert any(s.digest == f"sha256:{coder.sha256}" and s.completed == s.total == coder.size for s in steps)
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("no-such-model-anywhere")
    assert e.value.status_code == 404 and "file does not exist" in e.value.error


def test_delete_refusals(client: ollama.Client) -> None:
    for name, needle in (("smollm2", "embedded default"), ("local-copy", "did not install")):
        with pytest.raises(ollama.ResponseError) as e:
            client.delete(name)
        assert e.value.status_code == 400 and needle in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("no-such-model")
    assert e.value.status_code == 404


def test_errors_are_ollamas(client: ollama.Client, server: Server) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="missing:7b", messages=HI)
    assert e.value.status_code == 404 and e.value.error == 'model "missing:7b" not found, try pulling it first'
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="smollm2", messages=HI, options={"temperature": -3})
    assert e.value.status_code == 400 and "temperature" in e.value.error
    for path, body in (("/api/chat", {"model": "smollm2", "messages": [{"role": "user", "content": "x",
                                                                         "images": ["aGk="]}]}),
                       ("/api/generate", {"model": "smollm2", "prompt": "x", "suffix": "y"}),
                       ("/api/show", {}), ("/api/pull", {"model": 3})):
        r = httpx.post(f"{server.url}{path}", json=body, timeout=60)
        assert r.status_code == 400 and list(r.json()) == ["error"], (path, r.text)


def test_a_client_that_leaves_stops_the_engine_work(server: Server) -> None:
    before = server.metric("hearth_requests_cancelled_total")
    body = {"model": DEFAULT_MODEL_ID, "messages": [{"role": "user", "content": "Count to a thousand."}],
            "options": {"temperature": 0, "num_predict": 1500}}
    with contextlib.closing(httpx.Client(timeout=600)) as http, \
            http.stream("POST", f"{server.url}/api/chat", json=body) as r:
        first = next(r.iter_lines())
        assert json.loads(first)["done"] is False
    server.wait_metric("hearth_requests_cancelled_total", lambda v: v >= before + 1)
