"""`hearth server start|stop|status|logs`: a background server in the data directory."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from hearth.cli.client import APIError, Client, CLIError
from hearth.cli.common import ApiKeyOpt, JsonOpt, cli_errors, console, human_bytes, human_duration, plural, print_json
from hearth.cli.daemon import Daemon, ServeOptions
from hearth.cli.ps import in_memory, work_by_class, work_line

app = typer.Typer(help="Run Hearth in the background: start, stop, status, logs.", no_args_is_help=True)

DataDirOpt = Annotated[Path | None, typer.Option(
    "--data-dir", envvar="HEARTH_HOME", show_default=False,
    help="Data directory: pid file, lock, log, sessions (default: the user data dir).")]


def start_server(daemon: Daemon, options: ServeOptions, timeout: float = 300.0) -> dict[str, Any]:
    """Start a background server and wait for /health, with a spinner on stderr; what `hearth chat`
    uses too when nothing answers."""
    err = Console(stderr=True, highlight=False)
    t0 = time.monotonic()
    with err.status(f"starting hearth on port {options.port}…") as status:
        def on_wait(state: str) -> None:
            what = "loading the model" if state == "loading" else "waiting for the server"
            status.update(f"{what}… {time.monotonic() - t0:.0f}s")

        try:
            info = daemon.start(options, timeout=timeout, on_wait=on_wait)
        except KeyboardInterrupt:
            raise CLIError("interrupted; the server goes on starting in the background "
                           "(see: hearth server status, hearth server stop)", 130) from None
    return {"pid": info.pid, "url": info.url, "log": info.log, "seconds": round(time.monotonic() - t0, 1)}


@app.command()
@cli_errors
def start(
    model: Annotated[list[str] | None, typer.Option(
        "--model", "-m", envvar="HEARTH_MODEL", help="GGUF path, ID=PATH or 'default'. Repeatable.")] = None,
    host: Annotated[str, typer.Option(envvar="HEARTH_HOST", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="HEARTH_PORT")] = 8000,
    ctx: Annotated[int | None, typer.Option(envvar="HEARTH_CTX", help="Tokens per sequence.")] = None,
    parallel: Annotated[int | None, typer.Option(envvar="HEARTH_PARALLEL", help="KV slots.")] = None,
    threads: Annotated[int | None, typer.Option(envvar="HEARTH_THREADS", help="CPU threads.")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="HEARTH_API_KEY", help="Require this API key.")] = None,
    data_dir: DataDirOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the model to load.")] = 300.0,
    as_json: JsonOpt = False,
) -> None:
    """Start a server in the background and wait until its model is loaded.

    Only one background server runs per data directory (a lock file makes a second start fail).

    Example: hearth server start --port 8000 --parallel 4
    """
    options = ServeOptions(models=model or [], host=host, port=port, ctx=ctx, parallel=parallel,
                           threads=threads, api_key=api_key)
    out = start_server(Daemon(data_dir), options, timeout)
    if as_json:
        print_json(out)
    else:
        console().print(f"hearth server started: pid {out['pid']}, {out['url']} (ready in {out['seconds']}s); "
                        f"log: {out['log']}")


@app.command()
@cli_errors
def stop(
    data_dir: DataDirOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait after SIGTERM before SIGKILL.")] = 30.0,
) -> None:
    """Stop the background server (SIGTERM: running generations end cleanly) and wait for it.

    Example: hearth server stop
    """
    info = Daemon(data_dir).stop(timeout)
    console().print(f"hearth server stopped (pid {info.pid}, {info.url})")


def _fetch(client: Client, path: str) -> Any:
    """GET `path`: None when the server has no such endpoint, a `? (error)` string on other errors."""
    try:
        return client.get(path)
    except APIError as e:
        return None if e.status == 404 else f"? ({e})"
    except CLIError as e:
        return f"? ({e})"


CACHE_PREFIX = "hearth_prompt_cache_"
# /metrics series → the status field they sum into, per tier
CACHE_TIER_FIELDS = {"blocks": "blocks", "bytes": "bytes", "budget_bytes": "budget_bytes", "hits_total": "hits",
                     "hit_tokens_total": "hit_tokens"}


def cache_status(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, Any] | None:
    """The prompt cache, every model together, from /metrics (which an API key may read, where
    /admin/prompt-cache needs the admin key); None when the server reports no cache."""
    tiers = {t: dict.fromkeys(CACHE_TIER_FIELDS.values(), 0) for t in ("slot", "ram", "disk")}
    out: dict[str, Any] = {"tiers": tiers, "misses": 0, "disk_full": False}
    found = False
    for name, labels, value in samples:
        if not name.startswith(CACHE_PREFIX):
            continue
        found = True
        key, tier = name[len(CACHE_PREFIX):], labels.get("tier", "")
        if key in CACHE_TIER_FIELDS and tier in tiers:
            tiers[tier][CACHE_TIER_FIELDS[key]] += int(value)
        elif key == "misses_total":
            out["misses"] += int(value)
        elif key == "disk_full":
            out["disk_full"] = out["disk_full"] or value > 0
    return out if found else None


def cache_lines(cache: dict[str, Any]) -> list[str]:
    """Two lines for `hearth server status`: what each tier holds, and what each served."""
    t = cache["tiers"]
    held = "; ".join(f"{tier} off" if not t[tier]["budget_bytes"] else
                     f"{tier} {plural(t[tier]['blocks'], 'block')}, {human_bytes(t[tier]['bytes'])} of "
                     f"{human_bytes(t[tier]['budget_bytes'])}" for tier in ("ram", "disk"))
    if cache["disk_full"]:
        held += " (disk full: cache writes stopped)"
    served = ", ".join(f"{tier} {plural(t[tier]['hit_tokens'], 'token')} ({plural(t[tier]['hits'], 'hit')})"
                       for tier in ("slot", "ram", "disk"))
    return [f"  cache     {held}", f"  reused    {served}; {plural(cache['misses'], 'miss', 'misses')}"]


def gather_status(daemon: Daemon, api_key: str | None) -> dict[str, Any]:
    info = daemon.running()
    if info is None:
        return {"running": False, "data_dir": str(daemon.data_dir)}
    out: dict[str, Any] = {"running": True, "pid": info.pid, "url": info.url, "data_dir": str(daemon.data_dir),
                           "uptime_seconds": round(time.time() - info.started_at), "log": info.log}
    with Client(info.url, api_key) as client:
        out["health"] = client.health()
        if out["health"] != "ok":
            return out
        models = _fetch(client, "/v1/models")
        if isinstance(models, dict):
            loaded = in_memory(models["data"])  # the others load when a request names them
            out["models"] = [m["id"] for m in loaded]
            out["on_demand"] = [m["id"] for m in models["data"] if m not in loaded]
            out["parallel"] = sum(int(m.get("meta", {}).get("parallel") or 0) for m in loaded) or None
        else:
            out["models"] = models
        sessions = _fetch(client, "/v1/sessions")
        if isinstance(sessions, dict):
            out["sessions"] = len(sessions["data"])
            residency: dict[str, int] = {}
            for session in sessions["data"]:
                where = str(session.get("residency", "?"))
                residency[where] = residency.get(where, 0) + 1
            out["sessions_by_residency"] = residency
        else:
            out["sessions"] = sessions
        try:
            samples = client.samples()
        except CLIError:
            return out
        m: dict[str, float] = {}
        for name, _, value in samples:
            m[name] = m.get(name, 0.0) + value
        out["slots_busy"] = int(m.get("hearth_kv_slots_busy", 0))
        out["running_sequences"] = int(m.get("hearth_running_sequences", 0))
        out["waiting_requests"] = int(m.get("hearth_waiting_requests", 0))
        out["kv_tokens"] = int(m.get("hearth_kv_tokens", 0))
        out["swapped_kv_ram_bytes"] = int(m.get("hearth_swapped_kv_ram_bytes", 0))
        out["paused_kv_ram_bytes"] = int(m.get("hearth_paused_kv_ram_bytes", 0))
        out["paused_kv_disk_bytes"] = int(m.get("hearth_paused_kv_disk_bytes", 0))
        out["prompt_cache"] = cache_status(samples)
        work = work_by_class(samples)
        out["queued_by_class"], out["paused_by_class"] = work["queued"], work["paused"]
    return out


@app.command()
@cli_errors
def status(data_dir: DataDirOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Show the background server: model, address, uptime, sessions, KV slots in use, prompt cache.

    Exits 1 when no server runs.

    Example: hearth server status --json
    """
    out = gather_status(Daemon(data_dir), api_key)
    if as_json:
        print_json(out)
    elif not out["running"]:
        console().print(f"hearth server: not running (data dir {out['data_dir']})")
    else:
        c = console()
        slots = out.get("slots_busy")
        parallel = out.get("parallel")
        sessions = out.get("sessions")
        c.print(f"hearth server: running, pid {out['pid']}, up {human_duration(out['uptime_seconds'])}")
        c.print(f"  address   {out['url']}")
        c.print(f"  health    {out['health']}")
        models = out.get("models")
        c.print(f"  model     {', '.join(models) if isinstance(models, list) else models or '-'}")
        if out.get("on_demand"):
            c.print(f"  on demand {', '.join(out['on_demand'])} (hearth ps: what is loaded)")
        c.print(f"  slots     {'-' if slots is None else slots} busy of {parallel or '?'}"
                f" ({out.get('running_sequences', 0)} running, {out.get('waiting_requests', 0)} waiting)")
        if isinstance(sessions, int):
            where = ", ".join(f"{n} {k}" for k, n in sorted(out.get("sessions_by_residency", {}).items()))
            sessions = f"{sessions} ({where})" if where else str(sessions)
        if "queued_by_class" in out:
            c.print(f"  work      {work_line({'queued': out['queued_by_class'], 'paused': out['paused_by_class']})}")
        c.print(f"  sessions  {'not supported by this server' if sessions is None else sessions}")
        if "kv_tokens" in out:
            paused = ""
            if out["paused_kv_ram_bytes"] or out["paused_kv_disk_bytes"]:
                paused = (f"; paused requests' KV {human_bytes(out['paused_kv_ram_bytes'])} in RAM, "
                          f"{human_bytes(out['paused_kv_disk_bytes'])} on disk")
            c.print(f"  kv        {out['kv_tokens']} tokens in slots, "
                    f"{human_bytes(out['swapped_kv_ram_bytes'])} of swapped session KV in RAM{paused}")
        if out.get("prompt_cache"):
            for line in cache_lines(out["prompt_cache"]):
                c.print(line, markup=False)
        c.print(f"  data dir  {out['data_dir']}")
        c.print(f"  log       {out['log']}")
    if not out["running"]:
        raise typer.Exit(1)


@app.command()
@cli_errors
def logs(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C stops).")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", help="Lines from the end to print first (0: all).")] = 50,
    data_dir: DataDirOpt = None,
) -> None:
    """Print the background server's log file.

    Example: hearth server logs -f
    """
    path = Daemon(data_dir).log_file
    if not path.exists():
        raise CLIError(f"no server log at {path} (start one with: hearth server start)")
    with path.open("r", errors="replace") as f:
        text = f.readlines()
        sys.stdout.writelines(text[-lines:] if lines > 0 else text)
        sys.stdout.flush()
        if not follow:
            return
        try:
            while True:
                line = f.readline()
                if line:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                else:
                    time.sleep(0.25)
        except KeyboardInterrupt:
            return
