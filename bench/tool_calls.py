"""Tool calls in `auto` mode as the model writes them (issue 23): how many reach the client as
structured calls with `lenient_tool_calls` off and on, and what holding a stream costs.

    .venv/bin/python -m bench.tool_calls                    # qwen2.5-coder-0.5b, 40 prompts, ~5-10 min
    .venv/bin/python -m bench.tool_calls --limit 8          # smoke
    .venv/bin/python -m bench.tool_calls --prompts 23,25,27,32,33,35,37,38,39,0   # the text answers (and a call)

Starts this checkout's Hearth (`python -c 'from hearth.cli.main import app; app()' serve`, so the
code measured is the code here) on `--model` (default the catalog's qwen2.5-coder-0.5b, the
model Hearth ships for tools), one slot. Offers four tools (get_weather, calculator, web_search,
read_file) and sends 40 fixed prompts that each want one of them, in `auto` mode at temperature
0, streamed: once with `"lenient_tool_calls": false` (calls only in the template's `<tool_call>`
tags) and once with `true`, same server. Before each pair a 1-token request puts the prompt in
the prefix cache, and the order within a pair alternates, so both sides prefill the same.

Per answer: whether it reached the client as calls (`finish_reason: tool_calls`), the time to
first byte (first content character or first tool-call delta) and the text. Reported: the share
of structured calls off vs on; the median extra time to first byte on (on - off, per prompt) for
answers that became calls (held until the output ended) and for those that stayed text (held
until ruled out); for those, also the characters held before the first byte (replayed through
the parser, so independent of the machine's load), the tokens that are (the chunks of the
off stream that carry them), the time the model took to write them (off: first chunk to the
chunk that completes them) and what lenient on's extra time has beyond that (the rest of the
path); and whether every answer that stayed text on came out identical to off.
Writes bench/results/tool-calls-<stamp>.json (+ latest-tool-calls.json) after every prompt
(`"complete": false` until the last) and, at the end, a plot (.png). Prompts go round-robin
over the four tools, so a `--limit` covers all of them.
Timings mean something only on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.config import REPO_ROOT, RESULTS_DIR, Settings
from bench.machine import machine_info
from bench.report import save_json
from bench.servers import Launch, RunningServer, free_port
from bench.stats import median
from hearth.chat.tool_parsers import make_parser
from hearth.chat.types import Tool

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "web_search", "description": "Search the web and return the top results.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "max_results": {"type": "integer"}}, "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file from the user's disk.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]

PROMPTS = [
    # get_weather
    "What's the weather in Paris right now?", "Is it raining in London?", "How hot is it in Cairo today?",
    "Tell me the current temperature in Tokyo in fahrenheit.", "Weather for Berlin, please.",
    "Should I bring an umbrella in Seattle today?", "What's the weather like in Sydney?",
    "Check the weather in New York City.", "Is it snowing in Oslo?", "Current conditions in Madrid in celsius?",
    # calculator
    "What is 1234 * 5678?", "Compute (17 + 25) * 3 - 8.", "What's 2 to the power of 20?",
    "Calculate 15% of 240.", "What is 98765 divided by 321?", "Add 3.14159 and 2.71828.",
    "What's the square root of 1764?", "Compute 7 factorial.", "How much is 123456789 - 98765432?",
    "Multiply 0.75 by 64.",
    # web_search
    "Search the web for the latest Python release.", "Find recent news about the James Webb telescope.",
    "Look up who won the 2022 World Cup.", "Search for llama.cpp grammar documentation.",
    "Find the top 3 results for 'best hiking trails in Colorado'.", "What are people saying about Rust 2024 edition? "
    "Search for it.", "Search for the population of Canada.", "Find tutorials on async programming in Python.",
    "Look up the opening hours of the Louvre.", "Search the web for the GGUF file format specification.",
    # read_file
    "Read the file /etc/hostname.", "Show me what's in ~/notes/todo.txt.", "Open README.md and show it to me.",
    "What does config/settings.yaml contain?", "Read /var/log/syslog for me.", "Print the contents of src/main.py.",
    "Read the file docs/api.md.", "What's inside data/users.csv?", "Open ~/.bashrc and show me.",
    "Read pyproject.toml.",
]
assert len(PROMPTS) == 40


@dataclass
class Answer:
    prompt: int
    lenient: bool
    calls: list[dict[str, Any]]
    text: str
    finish_reason: str | None
    ttfb_s: float | None  # first content character or first tool-call delta
    total_s: float
    # Each content chunk as it came: (seconds after the request, characters received by then).
    # Off, this is the time the model took to write the characters lenient mode holds.
    marks: list[tuple[float, int]] = field(default_factory=list)


def log(msg: str) -> None:
    print(f"[tool_calls {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


async def ask(client: httpx.AsyncClient, url: str, i: int, lenient: bool, max_tokens: int) -> Answer:
    body = {"messages": [{"role": "user", "content": PROMPTS[i]}], "tools": TOOLS,
            "tool_choice": "auto", "temperature": 0, "max_tokens": max_tokens, "stream": True,
            "lenient_tool_calls": lenient}
    t0 = time.perf_counter()
    ttfb, text, finish = None, "", None
    calls: dict[int, dict[str, Any]] = {}
    marks: list[tuple[float, int]] = []
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if not chunk.get("choices"):
                continue
            choice = chunk["choices"][0]
            delta = choice.get("delta") or {}
            if (delta.get("content") or delta.get("tool_calls")) and ttfb is None:
                ttfb = time.perf_counter() - t0
            text += delta.get("content") or ""
            if delta.get("content"):
                marks.append((round(time.perf_counter() - t0, 4), len(text)))
            for tc in delta.get("tool_calls") or []:
                c = calls.setdefault(tc["index"], {"name": None, "arguments": ""})
                fn = tc.get("function") or {}
                c["name"] = fn.get("name") or c["name"]
                c["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return Answer(i, lenient, [calls[k] for k in sorted(calls)], text, finish, ttfb, time.perf_counter() - t0, marks)


def summarize(answers: list[Answer]) -> dict[str, Any]:
    by = {(a.prompt, a.lenient): a for a in answers}
    pairs = [(by[i, False], by[i, True]) for i in sorted({a.prompt for a in answers})]
    n = len(pairs)

    def share(lenient: bool) -> float:
        return sum(1 for off, on in pairs if (on if lenient else off).finish_reason == "tool_calls") / n

    def extra(became_call: bool) -> dict[str, Any]:
        d = [on.ttfb_s - off.ttfb_s for off, on in pairs if on.ttfb_s is not None and off.ttfb_s is not None
             and (on.finish_reason == "tool_calls") == became_call and off.finish_reason != "tool_calls"]
        return {"n": len(d), "median_s": r3(d),
                "max_s": round(max(d), 3) if d else None}

    text_pairs = [(off, on) for off, on in pairs if "tool_calls" not in (off.finish_reason, on.finish_reason)]
    # Load-independent: how many characters of each text answer the lenient parser holds before
    # its first byte goes out (replayed here one character at a time, as a stream feeds it).
    held = [held_chars(off.text) for off, _ in text_pairs]
    # Where the extra first-byte time goes: the chunks (tokens) the model took to write the held
    # characters with lenient off, and the time they took there (the same prompt, the same
    # tokens); what lenient on's extra time has beyond that is the rest of the path.
    held_tokens = [next((k for k, (_, n) in enumerate(off.marks) if n >= h), len(off.marks)) + 1
                   for (off, _), h in zip(text_pairs, held, strict=True)]
    writing = [off.marks[k - 1][0] - off.marks[0][0] for (off, _), k in zip(text_pairs, held_tokens, strict=True)
               if off.marks and k <= len(off.marks)]
    rest = [(on.ttfb_s - off.ttfb_s) - (off.marks[k - 1][0] - off.marks[0][0])
            for (off, on), k in zip(text_pairs, held_tokens, strict=True)
            if off.marks and k <= len(off.marks) and on.ttfb_s is not None and off.ttfb_s is not None]
    ttfb_off = [off.ttfb_s for off, _ in pairs if off.ttfb_s is not None]
    ttfb_on = [on.ttfb_s for _, on in pairs if on.ttfb_s is not None]
    return {
        "prompts": n,
        "structured_share_off": round(share(False), 3),
        "structured_share_on": round(share(True), 3),
        "ttfb_median_off_s": r3(ttfb_off),
        "ttfb_median_on_s": r3(ttfb_on),
        "extra_ttfb_became_calls": extra(True),  # held until the output ended
        "extra_ttfb_stayed_text": extra(False),  # held until ruled out (or not at all)
        "held_chars_stayed_text": {"n": len(held), "median": median(held) if held else None,
                                   "max": max(held) if held else None},
        "held_tokens_stayed_text": {"median": median(held_tokens) if held_tokens else None,
                                    "max": max(held_tokens) if held_tokens else None},
        # off: from the first chunk to the one that completes the held characters
        "writing_held_s": r3(writing),
        "extra_beyond_writing_s": r3(rest),
        "text_unchanged": all(off.text == on.text for off, on in text_pairs),
        "text_answers": len(text_pairs),
        "tools_called_on": {t["function"]["name"]: sum(1 for _, on in pairs if on.finish_reason == "tool_calls"
                                                       and any(c["name"] == t["function"]["name"] for c in on.calls))
                            for t in TOOLS},
    }


def r3(values: list[float]) -> float | None:
    m = median(values)
    return None if m is None else round(m, 3)


def held_chars(text: str) -> int:
    """Characters of `text` the lenient parser (hermes, these tools) takes in before it lets the
    first one out, fed one at a time: 1 for text that cannot be a call, len(text) for one that
    is held to the end."""
    tools = [Tool(t["function"]["name"], "", t["function"]["parameters"]) for t in TOOLS]
    p = make_parser("hermes", tools, lenient=True)
    for i, ch in enumerate(text):
        if any(isinstance(x, str) and x for x in p.feed(ch)):
            return i + 1
    return len(text)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(model=Path(args.model), threads=args.threads, parallel=1, ctx=args.ctx,
                        startup_timeout_s=300)
    port = free_port()
    argv = [sys.executable, "-c", "from hearth.cli.main import app; app()", "serve", "--model", args.model,
            "--host", "127.0.0.1", "--port", str(port), "--threads", str(args.threads), "--parallel", "1",
            "--ctx", str(args.ctx)]
    os.environ["PYTHONPATH"] = str(REPO_ROOT)
    os.environ.setdefault("HEARTH_HOME", tempfile.mkdtemp(prefix="hearth-toolcalls-"))
    result: dict[str, Any] = {
        "schema": 1, "timestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(), "model": args.model, "command": argv,
        "settings": {"max_tokens": args.max_tokens, "threads": args.threads, "ctx": args.ctx, "limit": args.limit},
    }
    answers: list[Answer] = []
    # Round-robin over the tools (prompt 0, 10, 20, 30, 1, 11, ...), so --limit (or an interrupted
    # run, whose results so far are written after every prompt) still covers all four.
    order = [k * 10 + j for j in range(10) for k in range(4)][:args.limit]
    if args.prompts:
        order = [i for i in order if i in args.prompts]
    async with RunningServer("hearth", Launch(argv, supports_ignore_eos=True), port, settings) as srv, \
            httpx.AsyncClient(timeout=300) as client:
        log(f"server ready in {srv.startup_s:.1f}s")
        for n, i in enumerate(order):
            warm = {"messages": [{"role": "user", "content": PROMPTS[i]}], "tools": TOOLS,
                    "max_tokens": 1, "temperature": 0}
            (await client.post(srv.base_url + "/v1/chat/completions", json=warm)).raise_for_status()
            for lenient in ((False, True) if i % 2 == 0 else (True, False)):
                answers.append(await ask(client, srv.base_url, i, lenient, args.max_tokens))
            off, on = (a for a in answers[-2:] if not a.lenient), (a for a in answers[-2:] if a.lenient)
            a_off, a_on = next(off), next(on)
            log(f"{i:2d} off={a_off.finish_reason:<10} on={a_on.finish_reason:<10} "
                f"ttfb {a_off.ttfb_s or 0:.2f}s/{a_on.ttfb_s or 0:.2f}s  {a_off.text[:60]!r}")
            result["complete"] = n + 1 == len(order)
            result["summary"] = summarize(answers)
            result["answers"] = [asdict(a) for a in answers]
            write(result, args.out_dir)
    return result


def write(result: dict[str, Any], out_dir: Path) -> Path:
    return save_json(result, out_dir, "tool-calls")[0]


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["summary"]
    by = {(a["prompt"], a["lenient"]): a for a in result["answers"]}
    prompts = sorted({p for p, _ in by})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.bar(["lenient off", "lenient on"], [s["structured_share_off"], s["structured_share_on"]],
            color=["#999999", "#2a7ab0"])
    ax1.set_ylim(0, 1)
    ax1.set_ylabel("share of answers reaching the client as tool calls")
    ax1.set_title(f"{len(prompts)} tool-use prompts, auto mode, temperature 0")
    for lenient, color in ((False, "#999999"), (True, "#2a7ab0")):
        xs = [p for p in prompts if by[p, lenient]["ttfb_s"] is not None]
        ax2.scatter(xs, [by[p, lenient]["ttfb_s"] for p in xs], s=14, color=color,
                    label=f"lenient {'on' if lenient else 'off'}")
    ax2.set_xlabel("prompt")
    ax2.set_ylabel("time to first byte (s), streamed")
    ax2.set_title("holding: a call arrives whole, when the output ends")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    p = argparse.ArgumentParser(prog="bench.tool_calls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="a GGUF path or an installed catalog model")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--limit", type=int, default=len(PROMPTS), help="only the first N prompts")
    p.add_argument("--prompts", type=lambda s: {int(x) for x in s.split(",")}, default=None,
                   help="only these prompts (indices, comma-separated), e.g. the ones that stay text")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)  # unwinds through the block that stops the server
    result = asyncio.run(main_async(args))
    path = write(result, args.out_dir)
    plot(result, path.with_suffix(".png"))
    print(json.dumps(result["summary"], indent=1))
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
