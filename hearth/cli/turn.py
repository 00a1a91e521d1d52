"""One chat turn streamed to the terminal, stoppable with Ctrl-C.

During a turn SIGINT does not raise: it posts `/v1/cancel {cancel_id}` from a helper thread,
and the stream keeps being read until the server ends it (finish_reason `cancelled`, then the
usage chunk and [DONE]), so the turn's text and usage arrive intact and the connection is never
torn mid-read. A second Ctrl-C gives up on the stream (closing it, which the server also treats
as a cancel).
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.text import Text

from hearth.cli.client import Client, CLIError
from hearth.cli.markdown import MarkdownStream


@dataclass(slots=True)
class TurnStats:
    """What `/stats` shows about the last turn."""

    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    ttft: float | None = None  # seconds from sending the request to the first token
    seconds: float = 0.0  # the whole turn
    decode_seconds: float = 0.0  # first token to last token

    @property
    def tokens_per_second(self) -> float | None:
        if not self.completion_tokens or self.completion_tokens < 2 or self.decode_seconds <= 0:
            return None
        return (self.completion_tokens - 1) / self.decode_seconds

    def describe(self) -> str:
        def num(v: float | None, fmt: str = "{}") -> str:
            return "-" if v is None else fmt.format(v)

        return (f"prompt tokens {num(self.prompt_tokens)} (cached {num(self.cached_tokens)}), "
                f"completion tokens {num(self.completion_tokens)}, "
                f"TTFT {num(None if self.ttft is None else self.ttft * 1000, '{:.0f} ms')}, "
                f"{num(self.tokens_per_second, '{:.1f}')} tok/s, total {self.seconds:.2f} s, "
                f"finish {self.finish_reason or '-'}")


@dataclass(slots=True)
class TurnResult:
    content: str
    reasoning: str
    stats: TurnStats
    interrupted: bool  # Ctrl-C was pressed during the turn


def new_cancel_id() -> str:
    return f"cli-{uuid.uuid4().hex}"


def run_turn(client: Client, body: dict[str, Any], out: Console, api_key: str | None = None, *,
             markdown: bool = False) -> TurnResult:
    """Stream one chat completion (`body` without `stream`), printing reasoning dimmed and the
    answer as it comes: rendered as markdown (markdown.py) when `markdown`, else plainly.
    Raises CLIError for a refused request (the REPL shows it and goes on)."""
    cancel_id = new_cancel_id()
    body = {**body, "cancel_id": cancel_id, "stream_options": {"include_usage": True}}
    pressed = threading.Event()

    def send_cancel() -> None:
        try:
            with Client(client.url, api_key) as c:
                c.cancel(cancel_id)
        except CLIError:
            pass  # closing the stream on a second Ctrl-C still stops it

    def on_sigint(signum: int, frame: object) -> None:
        if pressed.is_set():
            raise KeyboardInterrupt
        pressed.set()
        threading.Thread(target=send_cancel, daemon=True).start()

    stats = TurnStats()
    content: list[str] = []
    reasoning: list[str] = []
    in_reasoning = False
    t0 = time.monotonic()
    t_first = t_last = 0.0
    answer: MarkdownStream | None = None
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        for chunk in client.stream_chat(body):
            if chunk.error:
                raise CLIError(f"generation failed: {chunk.error}")
            for piece, is_reasoning in ((chunk.reasoning, True), (chunk.content, False)):
                if not piece:
                    continue
                t_last = time.monotonic()
                if stats.ttft is None:
                    stats.ttft, t_first = t_last - t0, t_last
                if is_reasoning != in_reasoning and (content or reasoning):
                    if answer is not None:  # reasoning after answer text (rare): the text so far stands
                        answer.close()
                        answer = None
                    else:
                        out.print("\n" if is_reasoning else "\n\n", end="", soft_wrap=True)
                in_reasoning = is_reasoning
                (reasoning if is_reasoning else content).append(piece)
                if markdown and not is_reasoning:
                    if answer is None:
                        answer = MarkdownStream(out, live=out.is_terminal)
                    answer.add(piece)
                else:
                    out.print(Text(piece, style="dim italic" if is_reasoning else ""), end="", soft_wrap=True)
            stats.finish_reason = chunk.finish_reason or stats.finish_reason
            if chunk.usage:
                stats.prompt_tokens = chunk.usage.get("prompt_tokens")
                stats.completion_tokens = chunk.usage.get("completion_tokens")
                stats.cached_tokens = (chunk.usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    except KeyboardInterrupt:
        stats.finish_reason = "cancelled"
    finally:
        signal.signal(signal.SIGINT, previous)
        stats.seconds = time.monotonic() - t0
        stats.decode_seconds = max(t_last - t_first, 0.0)
        if answer is not None:
            answer.close()  # ends with a newline of its own
    if (content or reasoning) and answer is None:
        out.print()
    if stats.finish_reason == "cancelled":
        out.print(Text("[stopped]", style="yellow"))
    elif stats.finish_reason == "length":
        out.print(Text("[cut off: token limit]", style="yellow"))
    return TurnResult("".join(content), "".join(reasoning), stats, pressed.is_set())
