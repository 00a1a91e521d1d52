"""`hearth launch claude|codex|opencode|qwen`: an agent CLI started against this server, with
everything it needs set (agents.py), as `ollama launch` does. The server is found as
`hearth chat` finds it (--url, HEARTH_URL, or the default address, where a background server is
started if none answers). The CLI replaces this process (exec), so its terminal, signals and
exit code are its own. Nothing is installed: a CLI missing from PATH gets its npm install
command and exit code 1.
"""

from __future__ import annotations

import os
import shutil
from typing import Annotated, Any

import typer

from hearth.cli.agents import AGENTS, Target
from hearth.cli.chat import connect
from hearth.cli.client import Client, CLIError
from hearth.cli.common import cli_errors


def server_key(api_key: str | None) -> str | None:
    """The key to hand the agent: --api-key / HEARTH_API_KEY, else the first of the server's own
    keys when this environment configures them (HEARTH_API_KEYS, as `hearth serve` reads it)."""
    if api_key:
        return api_key
    keys = [k for k in os.environ.get("HEARTH_API_KEYS", "").replace(",", " ").split() if k]
    return keys[0] if keys else None


def target(client: Client, key: str | None, model: str | None) -> Target:
    """The model asked for (default: the server's first) and its context window, from /v1/models."""
    cards: list[dict[str, Any]] = client.get("/v1/models")["data"]
    ids = [c["id"] for c in cards]
    if not ids:
        raise CLIError(f"the server at {client.url} serves no model")
    name = model or ids[0]
    card = next((c for c in cards if c["id"] == name), None)
    if card is None:
        raise CLIError(f"the server at {client.url} has no model {name!r}; it serves: {', '.join(ids)}")
    n_ctx = (card.get("meta") or {}).get("n_ctx")
    return Target(client.url, name, key, n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None)


@cli_errors
def launch(
    ctx: typer.Context,
    agent: Annotated[str, typer.Argument(help=f"The agent CLI: {', '.join(AGENTS)}.", show_default=False)],
    model: Annotated[str | None, typer.Option(help="Model id (default: the server's first).")] = None,
    url: Annotated[str | None, typer.Option(
        "--url", help="Server URL (env HEARTH_URL, default http://127.0.0.1:8000, where a server is started "
        "if none answers).", show_default=False)] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="HEARTH_API_KEY", help="API key, if the server needs one (default: the first of "
        "HEARTH_API_KEYS, when set).", show_default=False)] = None,
) -> None:
    """Start an agent CLI against this server: base URL, key, model and the settings that keep
    its prompts cacheable, all set for it. Arguments after the agent's name (after `--` for
    ones that look like options) go to the CLI.

    Example: hearth launch codex --model qwen2.5-coder-0.5b -- exec "Summarise README.md"
    """
    spec = AGENTS.get(agent)
    if spec is None:
        raise CLIError(f"unknown agent {agent!r}: choose one of {', '.join(AGENTS)}", 2)
    exe = shutil.which(spec.binary)
    if exe is None:
        raise CLIError(f"{spec.binary} is not installed (hearth installs nothing); install it with: {spec.install}")
    key = server_key(api_key)
    client = connect(url, key)
    with client:
        t = target(client, key, model)
    config = spec.configure(t)
    typer.echo(f"hearth launch: {spec.binary} ({exe}) against {t.url}, model {t.model}"
               + (f", context {t.context}" if t.context else ""), err=True)
    for name, value in config.env.items():
        shown = ("(the server's key)" if t.key else "(a placeholder: the server needs no key)") \
            if name in config.secret else value
        typer.echo(f"  {name}={shown}", err=True)
    if config.args:
        typer.echo(f"  arguments: {' '.join(config.args)}", err=True)
    argv = [exe, *config.args, *ctx.args]
    os.execvpe(exe, argv, {**os.environ, **config.env})
