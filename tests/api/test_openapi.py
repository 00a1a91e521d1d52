"""GET /openapi.json documents every route, and real answers have the documented shapes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.routing import Route

from hearth.api import wire
from hearth.api.openapi import OPERATIONS, UNDOCUMENTED, openapi_path
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
    check(wire.ChatCompletion, await c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 3,
                                                                         "logprobs": True, "top_logprobs": 2}))
    check(wire.TextCompletion, await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "logprobs": 1}))
    resp = check(wire.Response, await c.post("/v1/responses", json={"input": "hi", "max_output_tokens": 3}))
    check(wire.Response, await c.get(f"/v1/responses/{resp['id']}"))
    check(wire.Response, await c.post(f"/v1/responses/{resp['id']}/cancel"))
    check(wire.ResponseDeleted, await c.delete(f"/v1/responses/{resp['id']}"))
    check(wire.AnthropicMessage, await c.post("/v1/messages", json={"messages": USER, "max_tokens": 3}))
    check(wire.TokenCount, await c.post("/v1/messages/count_tokens", json={"messages": USER}))
    check(wire.ModelList, await c.get("/v1/models"))
    check(wire.ModelObject, await c.get("/v1/models/fake"))
    check(wire.Health, await c.get("/health"))
    check(wire.Tokenized, await c.post("/tokenize", json={"content": "hi"}))
    check(wire.Tokenized, await c.post("/tokenize", json={"content": "hi", "with_pieces": True}))
    check(wire.Tokenized, await c.post("/tokenize", json={"messages": USER}))
    check(wire.Detokenized, await c.post("/detokenize", json={"tokens": [104, 105]}))
    check(wire.Cancelled, await c.post("/v1/cancel", json={"cancel_id": "x"}))
    check(wire.PromptCacheStats, await c.get("/admin/prompt-cache"))
    check(wire.PromptCacheEntries, await c.get("/admin/prompt-cache/entries", params={"limit": 5}))
    check(wire.PromptCacheDigest, await c.get("/v1/prompt-cache/digest"))
    check(wire.PromptCacheCleared, await c.delete("/admin/prompt-cache"))

    check(wire.Session, await c.post("/v1/sessions", json={"session_id": "s1"}), 201)
    check(wire.ChatCompletion, await c.post("/v1/chat/completions", json={"session_id": "s1", "messages": USER,
                                                                         "max_tokens": 3}))
    check(wire.SessionList, await c.get("/v1/sessions"))
    check(wire.Session, await c.get("/v1/sessions/s1"))
    check(wire.SessionHistory, await c.get("/v1/sessions/s1/history"))
    snap = check(wire.Snapshot, await c.post("/v1/sessions/s1/save", json={"title": "t"}), 201)["snapshot_id"]
    check(wire.SessionChange, await c.post("/v1/sessions/s1/rollback", json={"keep_messages": 1}))
    check(wire.SessionChange, await c.post("/v1/sessions/s1/resize", json={"max_seq_len": 256}))
    check(wire.SessionChange, await c.post("/v1/sessions/s1/resize/next_pow2"))
    check(wire.SnapshotList, await c.get("/v1/snapshots"))
    check(wire.Snapshot, await c.get(f"/v1/snapshots/{snap}"))
    check(wire.Snapshot, await c.patch(f"/v1/snapshots/{snap}", json={"tags": ["a"]}))
    check(wire.SessionChange, await c.post(f"/v1/snapshots/{snap}/load", json={"session_id": "s2"}), 201)
    check(wire.SessionDeleted, await c.delete("/v1/sessions/s2"))
    check(wire.SnapshotDeleted, await c.delete(f"/v1/snapshots/{snap}"))

    check(wire.OpenAIError, await c.post("/v1/chat/completions", json={"messages": []}), 400)
    check(wire.OpenAIError, await c.get("/v1/sessions/nope"), 404)
    check(wire.AnthropicError, await c.post("/v1/messages", json={"messages": USER}), 400)


async def test_blocks_document_both_envelopes_it_answers(h: Harness) -> None:
    """/v1/prompt-cache/blocks answers a bad inner body in that path's envelope (the fuzzer found
    an Anthropic 400 documented as OpenAI's): both are documented, and both are what it sends."""
    doc = (await h.client.get("/openapi.json")).json()
    schema = doc["paths"]["/v1/prompt-cache/blocks"]["post"]["responses"]["400"]["content"]["application/json"]
    refs = {ref["$ref"].rsplit("/", 1)[1] for ref in schema["schema"]["anyOf"]}
    assert refs == {"OpenAIError", "AnthropicError"}
    c = h.client
    check(wire.AnthropicError, await c.post("/v1/prompt-cache/blocks", json={"path": "/v1/messages", "body": {}}), 400)
    check(wire.OpenAIError, await c.post("/v1/prompt-cache/blocks",
                                         json={"path": "/v1/chat/completions", "body": {}}), 400)
