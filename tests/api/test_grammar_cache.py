"""The grammar cache, seen through /metrics: a response_format or a tool list sent again is a hit
(compiled once per model), and one model's compiled grammars never serve another model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.api.test_model_loading import chat, models_server
from tests.helpers import sample

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["n"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]


async def _counts(h: Any, model: str) -> tuple[float | None, float | None]:
    text = (await h.client.get("/metrics")).text
    return (sample(text, f'hearth_grammar_cache_misses_total{{model="{model}"}}'),
            sample(text, f'hearth_grammar_cache_hits_total{{model="{model}"}}'))


async def test_a_resent_schema_or_tool_list_compiles_once_per_model(tmp_path: Path) -> None:
    async with models_server(tmp_path, "alpha", "beta", pinned=("alpha", "beta")) as (h, _):
        assert await _counts(h, "alpha") == (0, 0)
        for _ in range(3):
            r = await h.post("/v1/chat/completions", chat("alpha", max_tokens=4, response_format=FORMAT))
            assert r.status_code == 200, r.text
        assert await _counts(h, "alpha") == (1, 2)
        for _ in range(2):  # an agent's turn: the same tools again, a call forced
            r = await h.post("/v1/chat/completions", chat("alpha", max_tokens=4, tools=TOOLS, tool_choice="required"))
            assert r.status_code == 200, r.text
        assert await _counts(h, "alpha") == (2, 3)
        # The same schema on another model is that model's miss: compiled for its own vocabulary.
        r = await h.post("/v1/chat/completions", chat("beta", max_tokens=4, response_format=FORMAT))
        assert r.status_code == 200, r.text
        assert await _counts(h, "beta") == (1, 0)
        assert await _counts(h, "alpha") == (2, 3)


async def test_a_refused_grammar_is_a_400_every_time_and_never_cached(tmp_path: Path) -> None:
    async with models_server(tmp_path, "alpha", pinned=("alpha",)) as (h, _):
        for _ in range(2):
            r = await h.post("/v1/chat/completions", chat("alpha", grammar="start ::= \"x\""))
            assert r.status_code == 400 and "grammar" in r.text
        assert await _counts(h, "alpha") == (0, 0)
