"""A JSON schema (response_format, output_config, text.format, forced tool calls) or a raw grammar
that would expand past the bounds is a 400 naming the limit, answered before any expansion."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import Harness

HUGE = {"type": "array", "items": {"type": "integer"}, "minItems": 10_000_000}
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": HUGE}}}, "response_format"),
    ("/v1/chat/completions", {"messages": USER, "response_format": {"type": "json_object", "schema": HUGE}},
     "response_format"),
    ("/v1/chat/completions", {"messages": USER, "tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "xs": HUGE}, "required": ["xs"]}}}]}, "tools"),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": HUGE}}},
     "response_format"),
    ("/v1/messages", {"messages": USER, "output_config": {"format": {"type": "json_schema", "schema": HUGE}}},
     "response_format"),
    ("/v1/chat/completions", {"messages": USER, "grammar": "root ::= " + "(" * 3000 + '"a"' + ")" * 3000},
     "grammar"),
])
async def test_an_expanding_schema_is_a_400_naming_the_limit(h: Harness, path: str, body: dict[str, Any],
                                                             param: str) -> None:
    r = await h.client.post(path, json={**body, "max_tokens": 4})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "the limit is" in err["message"] and param in err["message"]
    if not path.startswith("/v1/messages"):
        assert err["param"] == param
