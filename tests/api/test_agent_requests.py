"""The agent CLIs' real requests, in process: what Codex CLI 0.169 and Claude Code 2.1.330 sent
(captured once, tests/fixtures/agents/README.md) goes through the whole app, with the Qwen2.5
chat template and a scripted model in place of the 32k one. The slow runs of the CLIs
themselves are in tests/agents."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from hearth.api.app import create_app
from hearth.backends.base import ModelCard
from hearth.backends.local.backend import LocalBackend
from hearth.backends.local.model import EngineSettings
from hearth.chat.template import ChatTemplate
from hearth.config import Settings
from hearth.engine.fake_runner import FakeSampler
from hearth.engine.types import SamplingParams
from hearth.models import ModelSpec
from tests.fakes import ScriptedRunner

FIXTURES = Path(__file__).parents[1] / "fixtures"
QWEN = (FIXTURES / "templates" / "qwen2.5-coder-0.5b-instruct.jinja").read_text()
MODEL = "qwen2.5-coder-0.5b"
MARK = "hearth-tool-ok-7f3a"  # what the captured task's command printed


class Scripted(ScriptedRunner):
    """Greedy whatever the request asks: the agents sample at their default temperature."""

    def new_sampler(self, params: SamplingParams) -> FakeSampler:
        return FakeSampler(self, replace(params, temperature=0.0))


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "agents" / name).read_text())


class Agent:
    """The app on a scripted model; `prompts` holds what the model was given, as text."""

    def __init__(self, client: TestClient, runner: Scripted) -> None:
        self.client, self.runner = client, runner

    def send(self, captured: dict[str, Any], body: dict[str, Any] | None = None) -> tuple[int, list[dict[str, Any]]]:
        """POST a captured request (or `body` on its path) as the client did; the status and the
        SSE events (each with its `event:` name under "_event"), or the JSON body."""
        headers = {k: v for k, v in captured["headers"].items() if k.lower() not in ("accept-encoding",)}
        r = self.client.post(captured["path"], json=body or captured["body"], headers=headers)
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            return r.status_code, [r.json()]
        events, name = [], None
        for line in r.text.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and line != "data: [DONE]":
                events.append({**json.loads(line[6:]), "_event": name})
        return r.status_code, events

    def prompt(self) -> str:
        """The last prompt, as the model's KV holds it."""
        seqs = [bytes(t for t in kv if t < 256).decode(errors="replace") for kv in self.runner.kv.values()]
        return max(seqs, key=len)


@contextmanager
def agent(tmp_path: Path, answer: str, *, n_ctx: int = 262_144, strict: bool = False) -> Iterator[Agent]:
    runner = Scripted(n_ctx_train=n_ctx, n_batch=4096)  # as EngineSettings(batch=4096) below
    runner.answer = answer.encode()

    def factory(spec: ModelSpec, settings: EngineSettings) -> Any:
        return runner, ModelCard(spec.id, 0, meta={"n_ctx": n_ctx}), ChatTemplate(QWEN)

    backend = LocalBackend([ModelSpec(MODEL, Path("fake.gguf"))],
                           EngineSettings(parallel=2, batch=4096, strict_max_tokens=strict), factory)
    app = create_app(backend, Settings(data_dir=tmp_path))
    with TestClient(app) as client:
        deadline = time.monotonic() + 30
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the fake model did not load"
            time.sleep(0.02)
        yield Agent(client, runner)


def call_text(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# ---- Codex CLI: POST /v1/responses -------------------------------------------------------------


def test_codex_first_request_gets_its_tool_call(tmp_path: Path) -> None:
    """Its tools hold a `namespace` (multi_agent_v1) and a hosted `web_search`: both accepted,
    the namespace's functions offered to the model, web_search left out of the prompt."""
    captured = fixture("codex-first.json")
    kinds = [t["type"] for t in captured["body"]["tools"]]
    assert "namespace" in kinds and "web_search" in kinds
    with agent(tmp_path, call_text("exec_command", {"cmd": "echo hi"})) as a:
        status, events = a.send(captured)
        assert status == 200, events
        assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
        done = events[-1]["response"]
        calls = [i for i in done["output"] if i["type"] == "function_call"]
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("exec_command", {"cmd": "echo hi"})]
        assert "namespace" not in calls[0]
        prompt = a.prompt()
        assert '"name": "close_agent"' in prompt and '"name": "exec_command"' in prompt
        assert "web_search" not in prompt.split("</tools>")[0]
        # Codex's two developer messages: the first leads, the second is a system turn in place
        assert prompt.count("<|im_start|>system\n") == 2
        assert done["tools"] == captured["body"]["tools"]  # echoed as given


def test_codex_gets_a_namespaced_call_back_under_its_namespace(tmp_path: Path) -> None:
    captured = fixture("codex-first.json")
    with agent(tmp_path, call_text("close_agent", {"id": "agent-1"})) as a:
        status, events = a.send(captured)
        assert status == 200
        item = next(e["item"] for e in events if e["type"] == "response.output_item.done")
        assert (item["type"], item["name"], item["namespace"]) == ("function_call", "close_agent", "multi_agent_v1")


def test_codex_request_with_the_tool_result_gets_the_answer(tmp_path: Path) -> None:
    captured = fixture("codex-after-tool.json")
    kinds = [i.get("type") for i in captured["body"]["input"]]
    assert kinds[-2:] == ["function_call", "function_call_output"]
    with agent(tmp_path, "It printed hearth-tool-ok-7f3a.") as a:
        status, events = a.send(captured)
        assert status == 200
        assert events[-1]["response"]["output_text"] == "It printed hearth-tool-ok-7f3a."
        prompt = a.prompt()
        assert '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "echo hearth-tool-ok-7f3a"}}' in prompt
        assert "<tool_response>\nChunk ID:" in prompt and "Output:\nhearth-tool-ok-7f3a\n" in prompt


@pytest.mark.parametrize(("first", "after", "call"), [
    ("codex-first.json", "codex-after-tool.json", ("exec_command", {"cmd": "echo " + MARK})),
    ("claude-code-bash-first.json", "claude-code-bash-after-tool.json", ("Bash", {"command": "echo " + MARK})),
])
def test_the_request_after_the_tool_finds_the_first_prompt_cached(tmp_path: Path, first: str, after: str,
                                                                  call: tuple[str, dict[str, Any]]) -> None:
    """What makes an agent's later turns cheap: the client resends the conversation, and its
    rendering starts with the whole first prompt (system turns, tools and all), byte for byte."""
    with agent(tmp_path, call_text(*call)) as a:
        status, events = a.send(fixture(first))
        assert status == 200
        prompt_tokens = usage(events)[0]
        a.runner.answer = b"It printed hearth-tool-ok-7f3a."
        status, events = a.send(fixture(after))
        assert status == 200
        total, cached = usage(events)
        assert prompt_tokens - 1 <= cached < total, (prompt_tokens, cached, total)


def usage(events: list[dict[str, Any]]) -> tuple[int, int]:
    """(prompt tokens, cached tokens) from a streamed Responses or Anthropic answer."""
    last = events[-1]
    if "response" in last:
        u = last["response"]["usage"]
        return u["input_tokens"], u["input_tokens_details"]["cached_tokens"]
    u = next(e for e in events if e["type"] == "message_delta")["usage"]
    prompt = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
    return prompt, u["cache_read_input_tokens"]


# ---- Claude Code: POST /v1/messages?beta=true ------------------------------------------------


def test_claude_code_first_request_gets_its_tool_use(tmp_path: Path) -> None:
    """A `system` turn inside `messages` (after the user's), thinking `adaptive`,
    context_management, output_config and a deferred tool: all accepted."""
    captured = fixture("claude-code-first.json")
    assert [m["role"] for m in captured["body"]["messages"]] == ["user", "system"]
    with agent(tmp_path, call_text("Bash", {"command": "echo hi", "description": "Print"})) as a:
        status, events = a.send(captured)
        assert status == 200, events
        names = [e["type"] for e in events]
        assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"
        start = next(e for e in events if e["type"] == "content_block_start")
        assert (start["content_block"]["type"], start["content_block"]["name"]) == ("tool_use", "Bash")
        assert next(e for e in events if e["type"] == "message_delta")["delta"]["stop_reason"] == "tool_use"
        prompt = a.prompt()
        env = captured["body"]["messages"][1]["content"][0]["text"]
        user = captured["body"]["messages"][0]["content"][-1]["text"]
        assert prompt.index(user) < prompt.index("<|im_start|>system\n" + env)  # the system turn, in place
        assert '"name": "DeferredToolPlaceholder"' not in prompt  # deferred until a tool search loads it


def test_claude_code_breakpoints_keep_its_whole_first_prompt(tmp_path: Path) -> None:
    """Its last turn (the system turn with the environment) carries a cache_control breakpoint:
    everything but the assistant header after it is written to the prompt cache, and reported so."""
    with agent(tmp_path, "ok") as a:
        status, events = a.send(fixture("claude-code-first.json"))
        assert status == 200, events
        u = next(e for e in events if e["type"] == "message_delta")["usage"]
        total, _ = usage(events)
        assert (u["cache_read_input_tokens"], u["cache_creation_input_tokens"]) == (
            0, total - len("<|im_start|>assistant\n"))


def test_strict_max_tokens_past_the_context_gets_anthropics_wording(tmp_path: Path) -> None:
    captured = fixture("claude-code-first.json")
    assert captured["body"]["max_tokens"] == 32000
    with agent(tmp_path, "ok", n_ctx=65_536, strict=True) as a:
        status, (err,) = a.send(captured)
    assert status == 400 and err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    m = re.fullmatch(r"input length and `max_tokens` exceed context limit: (\d+) \+ 32000 > 65536, "
                     r"decrease input length or `max_tokens` and try again", err["error"]["message"])
    assert m is not None and int(m[1]) + 32000 > 65_536, err


def test_claude_codes_max_tokens_past_the_context_is_served_within_it_by_default(tmp_path: Path) -> None:
    captured = fixture("claude-code-first.json")
    with agent(tmp_path, "Done.", n_ctx=65_536) as a:
        status, events = a.send(captured)
    assert status == 200
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text == "Done."


@pytest.mark.parametrize("name", ["codex-first.json", "codex-after-tool.json", "claude-code-first.json",
                                  "claude-code-bash-first.json", "claude-code-bash-after-tool.json"])
def test_the_fixtures_are_the_clients_own(name: str) -> None:
    """Guard against editing a capture by hand: each names its client and version."""
    headers = fixture(name)["headers"]
    agent_header = headers.get("user-agent", "") + headers.get("x-app", "") + headers.get("anthropic-beta", "")
    assert ("codex_exec/0.169.0" in agent_header) if name.startswith("codex") else ("claude-code" in agent_header)
