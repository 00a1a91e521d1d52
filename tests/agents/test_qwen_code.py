"""Stock Qwen Code (`qwen -p`, Chat Completions) completes a turn against Hearth, started by
`hearth launch qwen`, on its own default prompt (13,274 tokens with its tools in 0.24.4) and its own
max_tokens (32,768, past what the 32k window leaves): Hearth lowers the output budget to what
the window leaves instead of answering 400 (issue 37), and the time cap, counted from the first
token, leaves the long prefill alone.

Why the verdict cannot depend on the model: `AnswerProxy` (tests/agents/force_tool.py) gives each
request a one-sentence JSON answer format (max_tokens passes as Qwen Code sent it), so the model
can write no tool call and no long text and the turn ends on its own. What the sentence says is
the model's own: the test checks that Qwen Code reports exactly what Hearth streamed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hearth.cli.agents import NO_KEY
from tests.agents.clients import CONTEXT, MODEL, QWEN, launched, qwen_env, run
from tests.agents.conftest import statuses
from tests.agents.force_tool import AnswerProxy
from tests.helpers import Server


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_qwen_code_completes_a_turn_through_hearth_launch(qwen_server: Server, tmp_path: Path) -> None:
    if not QWEN.is_file():
        pytest.fail(f"{QWEN} is missing: run scripts/setup_agents.sh")
    work = tmp_path / "work"
    work.mkdir()
    log_start = qwen_server.log.stat().st_size
    with AnswerProxy(qwen_server.url) as proxy:
        result = run(launched("qwen", proxy.url, "-p", "Say hello in one sentence.", "-o", "json"),
                     qwen_env(tmp_path / "home"), work, timeout=3000)
    assert result.exit_code == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{proxy.report()}"
    assert f"hearth launch: qwen ({QWEN}) against {proxy.url}, model {MODEL}, context {CONTEXT}" in result.stderr

    # what Qwen Code sent is what launch set: Hearth's URL (the proxy's), the placeholder key, the model
    assert proxy.requests, result.stderr[-3000:]
    for s in proxy.requests:
        assert s.path == "/v1/chat/completions", proxy.report()
        assert s.headers.get("authorization") == f"Bearer {NO_KEY}"
        assert s.body["model"] == MODEL and s.body["stream"] is True
        assert s.status == 200, proxy.report()
    # every stream ran to its end (a stream Qwen Code cut, by its idle timer or its cap on a
    # stream's life, has no finish_reason; it retries it as a new request)
    for s in proxy.requests:
        assert any(data["choices"][0].get("finish_reason") == "stop" for name, data in s.events()
                   if data.get("choices")), proxy.report()
    first = proxy.requests[0]
    # its own max_tokens does not fit beside its prompt: without the clamp this was a 400
    usage = first.usage()
    assert usage, proxy.report()
    assert first.body["max_tokens"] + usage["prompt_tokens"] > CONTEXT, (first.body["max_tokens"], usage)
    # Qwen Code reports an answer Hearth streamed (after its turn it may send a request of its own)
    out = json.loads(result.stdout)
    final = [m for m in (out if isinstance(out, list) else [out]) if m.get("type") == "result"]
    assert final and final[-1]["result"].strip() in {s.text().strip() for s in proxy.requests}, \
        result.stdout[-3000:]
    logged = statuses(qwen_server, log_start)
    assert [s for s in logged if s[:2] == ("POST", "/v1/chat/completions")], logged
    assert [s for s in logged if s[2] >= 400] == []
