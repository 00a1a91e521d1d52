"""Stock Claude Code (`claude -p`, Anthropic Messages API) completes a tool round trip against
Hearth.

Why the verdict cannot depend on the model: `ForceToolProxy` (tests/agents/force_tool.py) sits
between the CLI and Hearth and fixes the model's part with grammars. In every request it narrows
`Bash`'s parameters to `{"command": <the test's echo command>}`; in the task's first request it
sets tool_choice to `Bash` (one call), so the model writes exactly that call; in every later
request it sets `output_config.format` to a one-sentence JSON object, so the answer cannot be a
tool call or run to the output cap and ends with `end_turn`. What the sentence says is the
model's own, and the test checks that Claude Code reports exactly the text Hearth streamed.
Claude Code runs with `--tools Bash` (its other tools' definitions would quadruple a cold
prompt that CI prefills on two cores; tests/api/test_agent_requests.py covers the default first
request) and may run only the test's echo command (`--allowedTools`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.agents.clients import claude_env, launched, run
from tests.agents.conftest import statuses
from tests.agents.force_tool import ForceToolProxy
from tests.helpers import Server

MARK = "hearth-tool-ok-7f3a"
COMMAND = f"echo {MARK}"


def stream_json(stdout: str) -> list[dict[str, Any]]:
    """`claude -p --output-format stream-json --verbose` prints one JSON message per line."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_claude_code_runs_the_models_tool_call_and_answers(qwen_server: Server, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    log_start = qwen_server.log.stat().st_size
    with ForceToolProxy(qwen_server.url, tool="Bash", command_key="command", command=COMMAND) as proxy:
        env = claude_env(tmp_path / "home", proxy.url)
        result = run(launched("claude", proxy.url, "-p", f"Run the shell command `{COMMAND}` and tell me what it "
                              "printed.", "--tools", "Bash", "--allowedTools", f"Bash({COMMAND})",
                              "--output-format", "stream-json", "--verbose"), env, work, timeout=3000)
    out = stream_json(result.stdout)
    assert result.exit_code == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{proxy.report()}"

    # the model's call ...
    uses = [b for m in out if m.get("type") == "assistant" for b in m["message"]["content"]
            if b.get("type") == "tool_use"]
    assert uses and uses[0]["name"] == "Bash" and uses[0]["input"]["command"] == COMMAND, proxy.report()
    # ... was run by Claude Code, and its result went back to Hearth ...
    results = [b for m in out if m.get("type") == "user" for b in m["message"]["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert results and not results[0].get("is_error") and MARK in json.dumps(results[0]["content"]), proxy.report()
    first, *later = proxy.requests
    assert first.forced and later and not any(s.forced for s in later), proxy.report()
    sent = [b for m in later[0].body["messages"] if isinstance(m["content"], list) for b in m["content"]
            if b.get("type") == "tool_result"]
    assert sent and MARK in json.dumps(sent[0]["content"])
    # ... and the model's answer, as Hearth streamed it, is what Claude Code reports
    final = out[-1]
    assert final.get("type") == "result" and final.get("subtype") == "success", proxy.report()
    streamed = later[-1].text()
    assert json.loads(streamed)["answer"].strip(), proxy.report()
    assert final["result"].strip() == streamed.strip(), proxy.report()
    assert all(s.status == 200 for s in proxy.requests)
    assert '"stop_reason":"end_turn"' in later[-1].answer(), proxy.report()  # it ended on its own
    logged = statuses(qwen_server, log_start)
    assert len([s for s in logged if s[0] == "POST"]) >= len(proxy.requests)  # the log was read
    assert [s for s in logged if s[2] >= 400] == []
    if os.environ.get("HEARTH_CAPTURE_FIXTURES"):  # refresh tests/fixtures/agents (see its README)
        save = Path(os.environ["HEARTH_CAPTURE_FIXTURES"]) / "claude-code"
        save.mkdir(parents=True, exist_ok=True)
        for i, s in enumerate(proxy.requests):
            record = {"path": s.path, "headers": s.headers, "body": s.body}
            (save / f"request-{i}.json").write_text(json.dumps(record, indent=1))
