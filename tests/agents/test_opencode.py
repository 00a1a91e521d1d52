"""Stock opencode (`opencode run`, Chat Completions through the AI SDK's OpenAI-compatible
provider) completes a turn against Hearth, started by `hearth launch opencode`, whose inline
config is the only one it has.

Why the verdict cannot depend on the model: `AnswerProxy` (tests/agents/force_tool.py) sits
between opencode and Hearth and gives each request a one-sentence JSON answer format, so the
model can write no tool call and no long text and the turn ends on its own. What the sentence
says is the model's own: the test checks that opencode prints exactly what Hearth streamed, and
that what opencode sent is what launch configured (base URL, key, model, output budget).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hearth.cli.agents import NO_KEY, opencode_output_limit
from tests.agents.clients import CONTEXT, MODEL, OPENCODE, launched, opencode_env, run
from tests.agents.conftest import statuses
from tests.agents.force_tool import AnswerProxy
from tests.helpers import Server


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_opencode_run_completes_a_turn_through_hearth_launch(qwen_server: Server, tmp_path: Path) -> None:
    if not OPENCODE.is_file():
        pytest.fail(f"{OPENCODE} is missing: run scripts/setup_agents.sh")
    work = tmp_path / "work"
    work.mkdir()
    log_start = qwen_server.log.stat().st_size
    with AnswerProxy(qwen_server.url) as proxy:
        # --title: the session's title is given, so opencode asks the model for none
        result = run(launched("opencode", proxy.url, "run", "--title", "hearth e2e", "Say hello in one sentence."),
                     opencode_env(tmp_path / "home"), work, timeout=3000)
    assert result.exit_code == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{proxy.report()}"
    assert f"hearth launch: opencode ({OPENCODE}) against {proxy.url}, model {MODEL}, context {CONTEXT}" \
        in result.stderr

    # what opencode sent is what launch's inline config told it: Hearth's URL (the proxy's),
    # the placeholder key, the model, and the output budget it asks for as max_tokens
    assert proxy.requests, result.stderr[-3000:]
    for s in proxy.requests:
        assert s.path == "/v1/chat/completions", proxy.report()
        assert s.headers.get("authorization") == f"Bearer {NO_KEY}"
        assert s.body["model"] == MODEL and s.body["stream"] is True
        assert s.body["max_tokens"] == opencode_output_limit(CONTEXT)
        assert s.status == 200, proxy.report()
    # one turn, one request: opencode found no overflow to compact (it did at once when launch
    # gave the whole window as output budget)
    assert len(proxy.requests) == 1, proxy.report()
    answer = proxy.requests[0]
    assert any(data["choices"][0].get("finish_reason") == "stop" for name, data in answer.events()
               if data.get("choices")), proxy.report()
    # opencode printed the answer Hearth streamed
    assert answer.text().strip() and answer.text().strip() in result.stdout, proxy.report()
    logged = statuses(qwen_server, log_start)
    assert [s for s in logged if s[:2] == ("POST", "/v1/chat/completions")], logged
    assert [s for s in logged if s[2] >= 400] == []
