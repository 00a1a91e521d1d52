"""`hearth replay ID`: send a journaled request again (a server started with `--journal`) and
say whether the answer is the same (docs/observability.md, "Replay").

The record (the request body as received, and its answer) comes from `--from` (default: the
usual server, HEARTH_URL); the request goes to `--url` (default: the same server) at its
recorded settings (temperature, seed, max_tokens: the body is sent as it was, unstreamed).
Compared: the answer's text and its tool calls (arguments as JSON values). Exit 0 when
identical, 1 when they differ (a unified diff shows how)."""

from __future__ import annotations

import difflib
import json
from typing import Annotated, Any

import typer

from hearth.cli.cache import AdminKeyOpt
from hearth.cli.client import Client
from hearth.cli.common import JsonOpt, UrlOpt, console, print_json


def _args(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def answer_of(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The text and tool calls of a protocol's unstreamed answer."""
    text, calls = "", []
    if path.endswith("/chat/completions"):
        msg = body["choices"][0]["message"]
        text = msg.get("content") or ""
        calls = [(c["function"]["name"], _args(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
    elif path.endswith("/completions"):
        text = body["choices"][0]["text"]
    elif path.endswith("/messages"):
        for block in body["content"]:
            if block["type"] == "text":
                text += block["text"]
            elif block["type"] == "tool_use":
                calls.append((block["name"], block["input"]))
    elif path.endswith("/responses"):
        for item in body["output"]:
            if item["type"] == "message":
                text += "".join(c.get("text", "") for c in item["content"] if c["type"] == "output_text")
            elif item["type"] == "function_call":
                calls.append((item["name"], _args(item["arguments"])))
    elif path == "/api/chat":
        text = body["message"].get("content") or ""
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in body["message"].get("tool_calls") or []]
    elif path == "/api/generate":
        text = body["response"]
    return {"text": text, "tool_calls": [{"name": n, "arguments": a} for n, a in calls]}


def recorded(answer: dict[str, Any]) -> dict[str, Any]:
    return {"text": answer["text"],
            "tool_calls": [{"name": c["name"], "arguments": _args(c["arguments"])} for c in answer["tool_calls"]]}


def replay(request_id: Annotated[str, typer.Argument(help="The request's id (the answer's `id`).")],
           url: UrlOpt = None, api_key: AdminKeyOpt = None,
           source: Annotated[str | None, typer.Option(
               "--from", help="The server whose journal holds the request (default: --url's).")] = None,
           source_key: Annotated[str | None, typer.Option(
               "--from-key", help="Its key (default: --api-key).")] = None,
           as_json: JsonOpt = False) -> None:
    """Send a journaled request again and compare the answers.

    Example: hearth replay chatcmpl-5f2c... --url http://new-server:8000
    """
    with Client(source or url, source_key or api_key) as client:
        rec = client.get(f"/admin/journal/{request_id}")
    body = {k: v for k, v in rec["request"].items() if k not in ("stream", "stream_options")}
    if rec["path"] in ("/api/chat", "/api/generate"):
        body["stream"] = False  # Ollama streams unless told
    with Client(url, api_key) as client:
        now = answer_of(rec["path"], client.post(rec["path"], body))
    before = recorded(rec["answer"])
    same = now == before
    if as_json:
        print_json({"id": request_id, "identical": same, "recorded": before, "replayed": now})
    elif same:
        console().print(f"identical: {request_id} ({rec['model']}, {rec['path']})")
    else:
        def lines(a: dict[str, Any]) -> list[str]:
            return [*a["text"].splitlines(), *(json.dumps(c, sort_keys=True) for c in a["tool_calls"])]

        console().print(f"differs: {request_id} ({rec['model']}, {rec['path']})", highlight=False)
        for line in difflib.unified_diff(lines(before), lines(now), "recorded", "replayed", lineterm=""):
            console().print(line, markup=False, highlight=False)
    if not same:
        raise typer.Exit(1)
