"""GET /openapi.json documents every route, and real answers have the documented shapes.

The handlers build answers as dicts and the answer models (hearth.api.wire lists them) only
describe them: these tests are what keeps the two from drifting apart."""

from __future__ import annotations

import inspect
import json
from types import ModuleType
from typing import Any

from pydantic import BaseModel
from starlette.routing import Route

from hearth.api.anthropic import wire as anthropic_wire
from hearth.api.ollama import wire as ollama_wire
from hearth.api.openai import wire as openai_wire
from hearth.api.openapi import openapi_path
from hearth.api.operations import OPERATIONS, UNDOCUMENTED
from hearth.api.wire import base, control
from hearth.api.wire import prompt_cache as cache_wire
from hearth.api.wire import sessions as session_wire
from hearth.api.wire import usage as usage_wire
from tests.api.conftest import Harness

USER = [{"role": "user", "content": "hi"}]


async def test_every_route_is_documented_and_nothing_else(h: Harness) -> None:
    doc = (await h.client.get("/openapi.json")).json()
    routed = {(openapi_path(r.path), m.lower()) for r in h.app.routes if isinstance(r, Route)
              and r.endpoint not in UNDOCUMENTED for m in (r.methods or ()) if m != "HEAD"}
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert routed == documented
    for op in OPERATIONS:  # every operation answers in a documented shape, errors included
        responses = doc["paths"][openapi_path(op.path)][op.method.lower()]["responses"]
        assert str(op.status) in responses and all(str(e) in responses for e in op.errors)


def check(model: type[BaseModel], r: Any, status: int = 200) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    model.model_validate(body)
    return body


async def test_answers_have_the_documented_shapes(h: Harness) -> None:
    c = h.client
    check(openai_wire.ChatCompletion, await c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 3,
                                                                         "logprobs": True, "top_logprobs": 2}))
    check(openai_wire.TextCompletion, await c.post("/v1/completions",
                                                   json={"prompt": "hi", "max_tokens": 3, "logprobs": 1}))
    resp = check(openai_wire.Response, await c.post("/v1/responses", json={"input": "hi", "max_output_tokens": 3}))
    check(openai_wire.Response, await c.get(f"/v1/responses/{resp['id']}"))
    check(openai_wire.Response, await c.post(f"/v1/responses/{resp['id']}/cancel"))
    check(openai_wire.ResponseDeleted, await c.delete(f"/v1/responses/{resp['id']}"))
    check(anthropic_wire.AnthropicMessage, await c.post("/v1/messages", json={"messages": USER, "max_tokens": 3}))
    check(anthropic_wire.TokenCount, await c.post("/v1/messages/count_tokens", json={"messages": USER}))
    check(control.ModelList, await c.get("/v1/models"))
    check(control.ModelObject, await c.get("/v1/models/fake"))
    check(control.Health, await c.get("/health"))
    check(control.Tokenized, await c.post("/tokenize", json={"content": "hi"}))
    check(control.Tokenized, await c.post("/tokenize", json={"content": "hi", "with_pieces": True}))
    check(control.Tokenized, await c.post("/tokenize", json={"messages": USER}))
    check(control.Detokenized, await c.post("/detokenize", json={"tokens": [104, 105]}))
    check(control.Cancelled, await c.post("/v1/cancel", json={"cancel_id": "x"}))
    check(cache_wire.PromptCacheStats, await c.get("/admin/prompt-cache"))
    check(cache_wire.PromptCacheEntries, await c.get("/admin/prompt-cache/entries", params={"limit": 5}))
    check(cache_wire.PromptCacheDigest, await c.get("/v1/prompt-cache/digest"))
    check(cache_wire.PromptCacheCleared, await c.delete("/admin/prompt-cache"))

    check(session_wire.Session, await c.post("/v1/sessions", json={"session_id": "s1"}), 201)
    check(openai_wire.ChatCompletion, await c.post("/v1/chat/completions", json={"session_id": "s1", "messages": USER,
                                                                         "max_tokens": 3}))
    check(session_wire.SessionList, await c.get("/v1/sessions"))
    check(session_wire.Session, await c.get("/v1/sessions/s1"))
    check(session_wire.SessionHistory, await c.get("/v1/sessions/s1/history"))
    snap = check(session_wire.Snapshot, await c.post("/v1/sessions/s1/save", json={"title": "t"}), 201)["snapshot_id"]
    check(session_wire.SessionChange, await c.post("/v1/sessions/s1/rollback", json={"keep_messages": 1}))
    check(session_wire.SessionChange, await c.post("/v1/sessions/s1/resize", json={"max_seq_len": 256}))
    check(session_wire.SessionChange, await c.post("/v1/sessions/s1/resize/next_pow2"))
    check(session_wire.SnapshotList, await c.get("/v1/snapshots"))
    check(session_wire.Snapshot, await c.get(f"/v1/snapshots/{snap}"))
    check(session_wire.Snapshot, await c.patch(f"/v1/snapshots/{snap}", json={"tags": ["a"]}))
    check(session_wire.SessionChange, await c.post(f"/v1/snapshots/{snap}/load", json={"session_id": "s2"}), 201)
    check(session_wire.SessionDeleted, await c.delete("/v1/sessions/s2"))
    check(session_wire.SnapshotDeleted, await c.delete(f"/v1/snapshots/{snap}"))

    check(openai_wire.OpenAIError, await c.post("/v1/chat/completions", json={"messages": []}), 400)
    check(openai_wire.OpenAIError, await c.get("/v1/sessions/nope"), 404)
    check(anthropic_wire.AnthropicError, await c.post("/v1/messages", json={"messages": USER}), 400)


async def test_blocks_document_both_envelopes_it_answers(h: Harness) -> None:
    """/v1/prompt-cache/blocks answers a bad inner body in that path's envelope (the fuzzer found
    an Anthropic 400 documented as OpenAI's): both are documented, and both are what it sends."""
    doc = (await h.client.get("/openapi.json")).json()
    schema = doc["paths"]["/v1/prompt-cache/blocks"]["post"]["responses"]["400"]["content"]["application/json"]
    refs = {ref["$ref"].rsplit("/", 1)[1] for ref in schema["schema"]["anyOf"]}
    assert refs == {"OpenAIError", "AnthropicError"}
    c = h.client
    check(anthropic_wire.AnthropicError,
          await c.post("/v1/prompt-cache/blocks", json={"path": "/v1/messages", "body": {}}), 400)
    check(openai_wire.OpenAIError, await c.post("/v1/prompt-cache/blocks",
                                         json={"path": "/v1/chat/completions", "body": {}}), 400)


ANSWER_MODULES = (openai_wire, anthropic_wire, ollama_wire, control, session_wire, cache_wire, usage_wire, base)


def models_of(module: ModuleType) -> list[type[BaseModel]]:
    return [m for _, m in inspect.getmembers(module, inspect.isclass)
            if issubclass(m, BaseModel) and m.__module__ == module.__name__]


async def test_every_answer_model_is_in_the_document(h: Harness) -> None:
    """No answer model is a mirror nobody reads: each one is an answer of the document or a part of one."""
    schemas = (await h.client.get("/openapi.json")).json()["components"]["schemas"]
    written = [m for module in ANSWER_MODULES for m in models_of(module)
               if m not in (base.HearthModel, base.ProtocolModel)]
    assert len(written) > 80
    assert [m.__name__ for m in written if m.__name__ not in schemas] == []


async def test_streamed_objects_have_the_documented_shapes(h: Harness) -> None:
    """The whole objects a stream carries are the documented answers too: a Responses stream's
    response (created, then completed), an Anthropic stream's message_start, each NDJSON line of
    Ollama's chat and generate."""
    events = await h.sse("/v1/responses", {"input": "hi", "max_output_tokens": 3})
    responses = [data["response"] for _, data in events if isinstance(data, dict) and "response" in data]
    assert len(responses) >= 2 and responses[-1]["status"] == "incomplete"  # max_output_tokens: 3
    for r in responses:
        openai_wire.Response.model_validate(r)
    events = await h.sse("/v1/messages", {"messages": USER, "max_tokens": 3})
    started = [data["message"] for name, data in events if name == "message_start"]
    assert len(started) == 1
    anthropic_wire.AnthropicMessage.model_validate(started[0])
    for path, body, model in (("/api/chat", {"messages": USER}, ollama_wire.OllamaChat),
                              ("/api/generate", {"prompt": "hi"}, ollama_wire.OllamaGenerate)):
        r = await h.post(path, {"model": "fake", **body, "options": {"num_predict": 3}})
        assert r.status_code == 200, r.text
        lines = [json.loads(ln) for ln in r.text.splitlines()]
        assert lines and lines[-1]["done"] is True
        for line in lines:
            model.model_validate(line)


async def test_ollama_answers_have_the_documented_shapes(h: Harness) -> None:
    c = h.client
    check(ollama_wire.OllamaChat, await c.post("/api/chat", json={"model": "fake", "messages": USER, "stream": False,
                                                                   "options": {"num_predict": 3}}))
    check(ollama_wire.OllamaGenerate, await c.post("/api/generate", json={"model": "fake", "prompt": "hi",
                                                                          "stream": False,
                                                                          "options": {"num_predict": 3}}))
    check(ollama_wire.OllamaModels, await c.get("/api/tags"))
    check(ollama_wire.OllamaModels, await c.get("/api/ps"))
    check(ollama_wire.OllamaShow, await c.post("/api/show", json={"model": "fake"}))
    check(ollama_wire.OllamaVersion, await c.get("/api/version"))
    check(ollama_wire.OllamaError, await c.post("/api/chat", json={"model": "fake", "messages": "hi"}), 400)
