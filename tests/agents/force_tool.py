"""Test-only: a reverse proxy between an agent CLI and Hearth that makes the model's first move
a call of the agent's shell tool, running the test's command.

A 0.5B model seldom calls a tool on its own, and a test that waited for it would be a test of
luck. The proxy rewrites these fields, and nothing else:
- in every request, the shell tool's parameters become `{command_key: {"enum": [command]}}`
  (the tool keeps its name and description), so a call of it can only run the test's harmless
  command. The same schema in every request keeps the prompt's prefix identical from one
  request to the next, so each later request finds the earlier prompt in the KV cache;
- in the agent's *first* request of a task (its conversation holds no tool result yet):
  `tool_choice` names the shell tool (Responses: `{"type": "function", "name": ...}`,
  Anthropic: `{"type": "tool", "name": ...}`), so Hearth's grammar makes the model call it,
  one call only (`parallel_tool_calls: false`; Anthropic: `disable_parallel_tool_use`). Left
  free, the grammar let the model write one string for hundreds of tokens (seen with Claude
  Code's own Bash schema), or repeat the call.
Every later request keeps the client's tool_choice: the answer to the tool's result is the
model's own. Every request gets `temperature: 0` (the agents send none, and a 0.5B model at
Hearth's default 1.0 rambled for hundreds of tokens after the tool result) and an output cap
of ANSWER_CAP tokens (Claude Code asks for 32000): a model that loops ends the test with a
clear `max_tokens`/`incomplete` instead of running for an hour. Paths, query strings, headers
and the streamed answers pass through byte for byte. Each request body (as the client sent it)
and its answer are kept in `requests`, for the assertions and the fixtures.
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

from tests.conftest import free_port

ANSWER_CAP = 512  # output tokens per request


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]  # as the client sent it
    forced: bool
    status: int = 0
    response: bytearray = field(default_factory=bytearray)  # the streamed answer, as sent

    def answer(self) -> str:
        return self.response.decode(errors="replace")


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
        """(the body to send upstream, whether its tool_choice was forced)."""
        if path.endswith("/responses"):
            first = not any(isinstance(i, dict) and i.get("type") == "function_call_output"
                            for i in body.get("input") or [])
            choice: dict[str, Any] = {"type": "function", "name": self.tool}
            single: dict[str, Any] = {"parallel_tool_calls": False}
        elif path.endswith("/messages"):
            first = not any(isinstance(b, dict) and b.get("type") == "tool_result"
                            for m in body.get("messages") or [] if isinstance(m.get("content"), list)
                            for b in m["content"])
            choice = {"type": "tool", "name": self.tool, "disable_parallel_tool_use": True}
            single = {}
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
        else:
            out["max_tokens"] = min(out.get("max_tokens") or ANSWER_CAP, ANSWER_CAP)
        if first:
            out.update(single, tool_choice=choice)
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
