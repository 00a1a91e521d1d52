"""The stock Codex CLI (`codex exec`, Responses API) completes a tool round trip against Hearth.

Why the verdict cannot depend on the model: `ForceToolProxy` (tests/agents/force_tool.py) sits
between the CLI and Hearth and fixes the model's part with grammars. In every request it narrows
`exec_command`'s parameters to `{"cmd": <the test's echo command>}`; in the task's first request
it sets tool_choice to `exec_command` (one call), so the model writes exactly that call; in every
later request it sets `text.format` to a one-sentence JSON object, so the answer cannot be a tool
call or run to the output cap and the response completes on its own. What the sentence says is
the model's own, and the test checks that Codex reports exactly the text Hearth streamed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.agents.clients import codex_env, launched, run
from tests.agents.conftest import statuses
from tests.agents.force_tool import ForceToolProxy
from tests.helpers import Server

MARK = "hearth-tool-ok-7f3a"
COMMAND = f"echo {MARK}"


def events(stdout: str) -> list[dict[str, Any]]:
    """`codex exec --json` prints one JSON event per line."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_codex_exec_runs_the_models_tool_call_and_answers(qwen_server: Server, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    log_start = qwen_server.log.stat().st_size
    with ForceToolProxy(qwen_server.url, tool="exec_command", command_key="cmd", command=COMMAND) as proxy:
        env = codex_env(tmp_path / "home", proxy.url)
        result = run(launched("codex", proxy.url, "exec", "--json", "--skip-git-repo-check",
                              f"Run the shell command `{COMMAND}` and tell me what it printed."),
                     env, work, timeout=3000)
    out = events(result.stdout)
    assert result.exit_code == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{proxy.report()}"

    # the model's call was executed by Codex ...
    runs = [e["item"] for e in out if e.get("type") == "item.completed"
            and e["item"].get("type") == "command_execution"]
    assert runs and MARK in runs[0]["aggregated_output"] and runs[0]["exit_code"] == 0, proxy.report()
    # ... its result went back to Hearth in the next request ...
    first, *later = proxy.requests
    assert first.forced and later and not any(s.forced for s in later), proxy.report()
    outputs = [i for i in later[0].body["input"] if i.get("type") == "function_call_output"]
    assert outputs and MARK in json.dumps(outputs[0]["output"])
    # ... and the model's answer, as Hearth streamed it, is what Codex reports
    answers = [e["item"]["text"] for e in out if e.get("type") == "item.completed"
               and e["item"].get("type") == "agent_message"]
    streamed = later[-1].text()
    assert json.loads(streamed)["answer"].strip(), proxy.report()
    assert answers and answers[-1].strip() == streamed.strip(), proxy.report()
    assert all(s.status == 200 for s in proxy.requests)
    assert "event: response.completed" in later[-1].answer(), proxy.report()  # it ended on its own
    logged = statuses(qwen_server, log_start)
    assert len([s for s in logged if s[0] == "POST"]) >= len(proxy.requests)  # the log was read
    assert [s for s in logged if s[2] >= 400] == []
    if os.environ.get("HEARTH_CAPTURE_FIXTURES"):  # refresh tests/fixtures/agents (see its README)
        save = Path(os.environ["HEARTH_CAPTURE_FIXTURES"]) / "codex"
        save.mkdir(parents=True, exist_ok=True)
        for i, s in enumerate(proxy.requests):
            record = {"path": s.path, "headers": s.headers, "body": s.body}
            (save / f"request-{i}.json").write_text(json.dumps(record, indent=1))
