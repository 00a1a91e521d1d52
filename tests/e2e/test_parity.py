"""Issue 14's parity items on the real default model: the fields users of the systems Hearth
replaces send (repetition detection, flush control, stream_thinking, t_max_predict_ms,
timings) and the bugs a careful user found, each reproduced."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.conftest import Server

pytestmark = pytest.mark.slow


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=120)


def ask(content: str, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, **kw}


@pytest.mark.parametrize(("field", "value"), [("repetition_penalty", 0), ("repetition_penalty", 11),
                                              ("repeat_penalty", 0)])
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_an_out_of_range_repetition_penalty_is_a_400(server: Server, path: str, field: str, value: float) -> None:
    # regression: repetition_penalty 0 was read as "not given" (`x or y`) and ran with 1.0
    body = ask("hi", max_tokens=2) if path == "/chat/completions" else {"prompt": "hi", "max_tokens": 2}
    r = post(server, path, {**body, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "repetition_penalty"


def test_a_reasoning_budget_leaves_grammar_constrained_output_alone(server: Server) -> None:
    # regression: the budget forced "</think>" into output whose grammar has its own think block
    grammar = 'root ::= "<think>" [a-z]{2,6} "</think>" [a-z ]{1,12}'
    r = post(server, "/chat/completions", ask("Think, then answer: what is blue?", grammar=grammar,
                                             reasoning_budget=1, max_tokens=40))
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    assert re.fullmatch(r"<think>[a-z]{2,6}</think>[a-z ]{1,12}", content), content
