"""Test-only: a reverse proxy between an agent CLI and Hearth that fixes the model's part of a
tool round trip, so a test of the round trip cannot depend on what a 0.5B model improvises.

The tests prove that Hearth carries a real client's tool loop: the call, its execution by the
client, the result sent back, a final answer, clean streams, no 4xx. What the model writes is not
under test, and left free it is chance: a 0.5B model on the edge writes a different answer when
the last bits of its logits move, and they move with which requests the CLI sends in parallel
and which slot and cached prefix each finds. (Seen in CI: the free answer after the tool result
ran to the 512-token cap writing a tool call as prose; Claude Code took the `max_tokens` stop
for a full context, compacted three times and gave up.) So the proxy rewrites these fields, and
nothing else, and each rewrite bounds what the model can do whatever its logits:

- every request: the shell tool's parameters become `{command_key: {"enum": [command]}}` (the
  tool keeps its name and description), so a call of it can only run the test's harmless
  command; the same schema in every request keeps the prompt's prefix identical from one request
  to the next, so each later one finds the earlier prompt in the KV cache. `temperature: 0`
  (the agents send none). An output cap of ANSWER_CAP tokens (Claude Code asks for 32000), above
  what either grammar below can write, so it is never what ends an answer.
- the task's *first* request (its conversation holds no tool result yet): `tool_choice` names
  the shell tool (Responses: `{"type": "function", "name": ...}`, Anthropic: `{"type": "tool",
  ...}`), one call only (`parallel_tool_calls: false`; Anthropic: `disable_parallel_tool_use`).
  Hearth's grammar then writes exactly one call of it with the one allowed command, and the
  grammar's end is the answer's end (`tool_calls` / `tool_use`).
- every *later* request (the tool's result is in the conversation): the protocol's own
  structured output (Responses `text.format`, Anthropic `output_config.format`) set to ANSWER,
  an object whose one field is a sentence of at most ANSWER_CHARS plain characters. The grammar
  can write nothing else: no tool call (in any format, tagged or not: the answer's first byte is
  `{` and its only key is `answer`), no endless text. Once the object closes only the end of the
  turn is allowed, so the answer ends on its own (`end_turn` / `completed`), short, every time;
  no stop reason reaches the client that would make it compact, continue or retry. The tools
  stay in the prompt (tool_choice is the client's own), so the prefix is still reused. What the
  sentence says is the model's own: the tests assert that the client's final answer is exactly
  the text Hearth streamed.

Paths, query strings, headers and the streamed answers pass through byte for byte. Each request
body (as the client sent it) and its answer are kept in `requests`, for the assertions and the
fixtures.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.helpers import free_port

ANSWER_CHARS = 120  # the final answer's sentence, at most
# The final answer: a JSON object with one short sentence. Plain printable ASCII without quotes or
# backslashes, so every character is one JSON character; llama.cpp's converter makes the
# whitespace between tokens `" "?`, so the grammar's whole text is at most ANSWER_CHARS + 20
# characters, and every token writes at least one.
ANSWER: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "pattern": f"^[A-Za-z0-9 ,.:;!?()_-]{{1,{ANSWER_CHARS}}}$"}},
    "required": ["answer"],
    "additionalProperties": False,
}
ANSWER_CAP = 512  # output tokens per request: above what either grammar can write, never reached


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]  # as the client sent it
    forced: bool  # the first request: tool_choice forced the shell tool; else the answer's format was set
    status: int = 0
    response: bytearray = field(default_factory=bytearray)  # the streamed answer, as sent

    def answer(self) -> str:
        return self.response.decode(errors="replace")

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        """(event name, data) of each SSE event of the streamed answer."""
        out = []
        for block in self.answer().split("\n\n"):
            name = next((line[7:] for line in block.splitlines() if line.startswith("event: ")), "")
            data = "\n".join(line[6:] for line in block.splitlines() if line.startswith("data: "))
            if data and data != "[DONE]":
                out.append((name, json.loads(data)))
        return out

    def text(self) -> str:
        """The answer's text as Hearth streamed it (Messages text deltas, Responses output text)."""
        parts = []
        for name, data in self.events():
            if name == "content_block_delta" and data["delta"].get("type") == "text_delta":
                parts.append(data["delta"]["text"])
            elif name == "response.output_text.delta":
                parts.append(data["delta"])
            elif not name and data.get("choices"):  # Chat Completions chunks carry no event name
                parts.append(data["choices"][0].get("delta", {}).get("content") or "")
        return "".join(parts)

    def usage(self) -> dict[str, Any]:
        """The streamed Chat Completions answer's usage (its last chunk, with include_usage)."""
        found = [data["usage"] for name, data in self.events() if not name and data.get("usage")]
        return found[-1] if found else {}


@dataclass
class ForceToolProxy:
    upstream: str  # Hearth's base URL, e.g. http://127.0.0.1:8000
    tool: str  # the shell tool: exec_command (Codex), Bash (Claude Code)
    command_key: str  # its command argument: cmd (Codex), command (Claude Code)
    command: str
    requests: list[Seen] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- the rewrite ----------------------------------------------------------------------

    def rewrite(self, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """(the body to send upstream, whether it is the task's first request, whose
        tool_choice was forced; later ones get the ANSWER format)."""
        if path.endswith("/responses"):
            first = not any(isinstance(i, dict) and i.get("type") == "function_call_output"
                            for i in body.get("input") or [])
        elif path.endswith("/messages"):
            first = not any(isinstance(b, dict) and b.get("type") == "tool_result"
                            for m in body.get("messages") or [] if isinstance(m.get("content"), list)
                            for b in m["content"])
        else:
            return body, False
        out = copy.deepcopy(body)
        pinned = {"type": "object", "properties": {self.command_key: {"type": "string", "enum": [self.command]}},
                  "required": [self.command_key], "additionalProperties": False}
        shell = [t for t in out.get("tools") or [] if t.get("name") == self.tool]
        if not shell:
            raise AssertionError(f"the client declared no {self.tool!r} tool")
        for t in shell:
            t["input_schema" if "input_schema" in t else "parameters"] = pinned
        out["temperature"] = 0
        if path.endswith("/responses"):
            out["max_output_tokens"] = min(out.get("max_output_tokens") or ANSWER_CAP, ANSWER_CAP)
            if first:
                out.update(parallel_tool_calls=False, tool_choice={"type": "function", "name": self.tool})
            else:
                fmt = {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}
                out["text"] = {**(out.get("text") or {}), "format": fmt}
        else:
            out["max_tokens"] = min(out.get("max_tokens") or ANSWER_CAP, ANSWER_CAP)
            if first:
                out["tool_choice"] = {"type": "tool", "name": self.tool, "disable_parallel_tool_use": True}
            else:
                fmt = {"type": "json_schema", "schema": ANSWER}
                out["output_config"] = {**(out.get("output_config") or {}), "format": fmt}
        return out, first

    def report(self) -> str:
        """Every request's path, status and the end of its answer: for assertion messages."""
        return "\n".join(f"--- {s.path} {s.status} forced={s.forced}\n{s.answer()[-1500:]}" for s in self.requests)

    # ---- the proxy ------------------------------------------------------------------------

    async def _forward(self, request: Request) -> Response:
        raw = await request.body()
        path = request.url.path
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        body: dict[str, Any] | None = json.loads(raw) if raw and request.method == "POST" else None
        seen = None
        if body is not None:
            sent, forced = self.rewrite(path, body)
            query = f"?{request.url.query}" if request.url.query else ""
            seen = Seen(path + query, dict(request.headers), body, forced)
            self.requests.append(seen)
            raw = json.dumps(sent).encode()
        client = httpx.AsyncClient(timeout=httpx.Timeout(None))
        upstream = client.build_request(request.method, f"{self.upstream}{path}", params=request.query_params,
                                        headers=headers, content=raw)
        resp = await client.send(upstream, stream=True)
        if seen is not None:
            seen.status = resp.status_code

        async def close() -> None:
            await resp.aclose()
            await client.aclose()

        passed = {k: v for k, v in resp.headers.items()
                  if k.lower() not in ("content-length", "transfer-encoding", "connection")}
        async def relay() -> AsyncIterator[bytes]:
            async for chunk in resp.aiter_raw():
                if seen is not None:
                    seen.response += chunk
                yield chunk

        return StreamingResponse(relay(), status_code=resp.status_code, headers=passed,
                                 background=BackgroundTask(close))

    def __enter__(self) -> ForceToolProxy:
        app = Starlette(routes=[Route("/{path:path}", self._forward, methods=["GET", "POST", "HEAD", "DELETE"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="force-tool-proxy", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self._server.started:
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)


@dataclass
class AnswerProxy(ForceToolProxy):
    """For the CLIs that speak Chat Completions (opencode, Qwen Code) in a one-turn run: every
    request that does not name its own `response_format` gets the ANSWER object as one, and
    `temperature: 0`; its tools, tool_choice and max_tokens pass as the CLI sent them (the test
    checks what Hearth does with the CLI's own max_tokens). The grammar can write no tool call
    and no long text, so each answer ends on its own (`stop`) and the CLI's turn ends with it.
    A request with its own response_format (a CLI's internal JSON query) passes untouched but
    for the temperature."""

    tool: str = ""
    command_key: str = ""
    command: str = ""

    def rewrite(self, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        if not path.endswith("/chat/completions"):
            return body, False
        out = copy.deepcopy(body)
        out["temperature"] = 0
        if not out.get("response_format"):
            out["response_format"] = {"type": "json_schema",
                                      "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
        return out, False
