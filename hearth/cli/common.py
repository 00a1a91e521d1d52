"""What every CLI verb shares: connection options, one-line errors, rich output helpers."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.status import Status

from hearth.cli.client import CLIError


def interactive_sigint() -> None:
    """Make Ctrl-C raise KeyboardInterrupt wherever the process was started from. A background
    job of a shell without job control (CI runners, nohup'ed scripts) starts with SIGINT
    ignored, and Python then installs no handler of its own, so a REPL would never see Ctrl-C."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


P = ParamSpec("P")
R = TypeVar("R")

UrlOpt = Annotated[str | None, typer.Option(
    "--url", envvar="HEARTH_URL", show_default=False,
    help="Server URL (default: http://127.0.0.1:8000).")]
ApiKeyOpt = Annotated[str | None, typer.Option(
    "--api-key", envvar="HEARTH_API_KEY", show_default=False,
    help="API key, if the server needs one.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]
# What a server (`hearth serve`, `hearth gateway`) requires of its clients.
RequireKeyOpt = Annotated[list[str] | None, typer.Option(
    "--api-key", help="Require this key (repeatable). Env: HEARTH_API_KEYS, comma-separated.")]
InsecureOpt = Annotated[bool, typer.Option(
    envvar="HEARTH_INSECURE", help="Allow a non-loopback bind without an API key.")]
CorsOpt = Annotated[str, typer.Option(
    "--cors-origins", envvar="HEARTH_CORS_ORIGINS",
    help="Web origins allowed to call from a browser (CORS), comma-separated: loopback (http/https on "
         "localhost, 127.0.0.1, [::1], any port), an origin like https://app.example.com, one with * in its "
         "host, or * for any. \"\" turns CORS off. Preflights need no API key; requests still do.")]


def required_keys(flags: list[str] | None) -> list[str]:
    """The keys a server requires: its --api-key flags, then HEARTH_API_KEYS (comma-separated)."""
    return [k.strip() for k in [*(flags or []), *os.environ.get("HEARTH_API_KEYS", "").split(",")] if k.strip()]


def console() -> Console:
    # Built per call so it writes to whatever sys.stdout is now (CliRunner swaps it).
    return Console(highlight=False, soft_wrap=True)


def spinner(text: str) -> Status:
    """A spinner on stderr while slow work runs (silent when stderr is not a terminal)."""
    return Console(stderr=True).status(text)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `error: message` on stderr; return the Exit to raise."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return typer.Exit(code)


def cli_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn the errors a verb expects into one line on stderr and a non-zero exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except CLIError as e:
            raise fail(str(e), e.code) from None
        except OSError as e:
            raise fail(f"{e.strerror or e}{': ' + str(e.filename) if e.filename else ''}") from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None

    return wrapper


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def print_result(data: R, as_json: bool, render: Callable[[Console, R], None]) -> None:
    """A verb's result: JSON for scripts (--json), else `render`ed for people."""
    if as_json:
        print_json(data)
    else:
        render(console(), data)


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 block`, `3 blocks`; `many` for an irregular plural (`misses`)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def human_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {s:02d}s"
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {m:02d}m"
    return f"{hours // 24}d {hours % 24}h"


def ago(timestamp: float | int | None) -> str:
    if not timestamp:
        return "-"
    return human_duration(time.time() - float(timestamp)) + " ago"
