"""Hostile requests against the real model: each is a 400 and the server keeps serving."""

from __future__ import annotations

import httpx

from tests.helpers import Server

USER = [{"role": "user", "content": "hi"}]


def still_serving(server: Server) -> None:
    assert server.proc.poll() is None
    r = httpx.post(f"{server.base_url}/chat/completions", timeout=60,
                   json={"messages": USER, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200


def test_a_grammar_nested_past_llamacpps_recursion_is_a_400_not_a_crash(server: Server) -> None:
    # 20,000 nested groups overflowed the stack in llama.cpp's grammar parser: the process died.
    deep = "root ::= " + "(" * 20_000 + '"a"' + ")" * 20_000
    r = httpx.post(f"{server.base_url}/chat/completions", timeout=60,
                   json={"messages": USER, "max_tokens": 2, "grammar": deep})
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"
    still_serving(server)


def test_expanding_schemas_and_oversized_prompts_are_refused(server: Server) -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 10_000_000}
    r = httpx.post(f"{server.base_url}/chat/completions", timeout=60, json={
        "messages": USER, "max_tokens": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert r.status_code == 400 and "minItems" in r.json()["error"]["message"]
    r = httpx.post(f"{server.base_url}/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "word " * 2_000_000}], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(f"{server.url}/tokenize", timeout=60, content=b'{"content": "' + b"x" * (31 << 20) + b'"}')
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    still_serving(server)
