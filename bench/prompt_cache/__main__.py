"""`python -m bench.prompt_cache`: the durable prompt cache (issue 24), Hearth against llama-server.

    .venv/bin/python -m bench.prompt_cache --wait-idle 120          # everything, ~50 min on 2 idle cores
    .venv/bin/python -m bench.prompt_cache --quick                  # SmolLM2, 5-10 min: development
    .venv/bin/python -m bench.prompt_cache --fixtures codex-first --parts restart,disk --servers hearth

The requests are Claude Code's and Codex's real first requests (tests/fixtures/agents, as
bench/agents.py replays them: streamed to /v1/messages and /v1/responses, 1 output token,
temperature 0, a tag in front of the system text so nothing from elsewhere is cached) on the
32k tool-calling model (qwen2.5-coder-0.5b, `--ctx 32768`, one slot, `--threads 2`). Each
server starts freshly on an empty state directory per fixture (Hearth `--data-dir`,
llama-server `--slot-save-path`), runs the fixture's cold request once (a) and then, `--runs`
times each, restarts: graceful (SIGTERM, wait for the exit) and `kill -9` (b), and a graceful
one with the state files dropped from the page cache (d); then `--second-runs` second
conversations per `--variants` (c) after a restart. The order and what each step measures:
bench/prompt_cache/measure.py; where a second conversation differs: conversations.py.

Hearth is waited for until its writer has put the blocks on disk (its data directory is
polled: block files present, none half-written, unchanged for a second) before any restart.
llama-server saves slot 0 after the cold request and restores it after every restart (the
first answer after a restart counts the restore); "llama-server (RAM cache)" is what it
answers with nothing but its RAM cache, which a restart empties: a cold prefill (the cold
measurement, unless `--peer-cold-restart` measures it once more).

Part e (`shared`, Hearth only): `--conversations` Claude Code conversations that differ only
in the user's task, one after another on one server that starts with the blocks of the
fixture's cold request; the disk they take against one whole KV per conversation.

Where the ~50 minutes go on 2 cores: four cold prefills (2-3 min each), the second
conversations from another directory on Claude Code (Claude Code puts the directory in its
system prompt, so each prefills most of its ~11.5k tokens: ~3 min, 3 runs per server;
`--second-runs 1` saves ~12 min), part e (~40 s per conversation: the tokens after the task).

Writes results/prompt-cache-<stamp>.json (+ latest-prompt-cache.json) after every server and
fixture ("complete": false until the end), the plot prompt-cache-<stamp>.png (+
latest-prompt-cache.png), and prints the tables. Only numbers from an idle machine mean much;
the cold prefills are ~2-3 minutes each on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from bench.agents import FIXTURES, default_model, load_fixture
from bench.config import REPO_ROOT, RESULTS_DIR, Settings
from bench.config import default_model as smollm2
from bench.cpu import wait_idle
from bench.machine import machine_info
from bench.prompt_cache import summary
from bench.prompt_cache.conversations import VARIANTS, without_tools
from bench.prompt_cache.measure import PARTS, Plan, log, run_fixture, shared_prefix, work_dir
from bench.prompt_cache.plot import plot
from bench.report import save_json
from bench.servers import ServerUnavailable


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.prompt_cache", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="hearth,llama-server")
    p.add_argument("--fixtures", default=",".join(FIXTURES))
    p.add_argument("--parts", default=",".join(PARTS), help=f"of {', '.join(PARTS)} (the cold request always runs)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="second conversations (c)")
    p.add_argument("--model", type=Path, default=None, help="GGUF (default: qwen2.5-coder-0.5b; --quick: SmolLM2)")
    p.add_argument("--ctx", type=int, default=None, help="context of the one slot (default 32768; --quick: 8192)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=None, help="restarts per kind and in-slot repeats (default 3)")
    p.add_argument("--second-runs", type=int, default=None, help="second conversations per variant (default 3)")
    p.add_argument("--conversations", type=int, default=None, help="part e (default 20)")
    p.add_argument("--shared-fixture", default="claude-code-first", help="part e's fixture")
    p.add_argument("--max-tokens", type=int, default=1)
    p.add_argument("--peer-cold-restart", action="store_true",
                   help="measure llama-server's RAM cache after a restart once (a cold prefill) instead of "
                        "taking its cold measurement")
    p.add_argument("--quick", action="store_true", help="SmolLM2, 8k context, the fixtures without their tools, "
                   "2 runs, 1 second conversation per variant, 4 conversations in part e")
    p.add_argument("--wait-idle", type=float, default=0.0, help="before each server, wait up to this long for an "
                   "idle machine")
    p.add_argument("--max-foreign-cpu", type=float, default=0.10)
    p.add_argument("--retries", type=int, default=None,
                   help="re-runs of a contaminated measurement after a restart (default 2; --quick: 0)")
    p.add_argument("--keep-state", action="store_true", help="keep the servers' state directories (printed)")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--report", type=Path, default=None, metavar="JSON",
                   help="measure nothing: summarize an earlier run's JSON again, print its tables, redraw its plot")
    return p.parse_args(argv)


def _list(text: str, known: tuple[str, ...] | None = None) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if known is not None and x not in known]
    if bad:
        raise SystemExit(f"unknown: {', '.join(bad)}; known: {', '.join(known or ())}")
    return items


def configure(a: argparse.Namespace) -> tuple[Settings, Plan]:
    q = a.quick
    model = a.model or (smollm2() if q else default_model())
    s = Settings(model=model.resolve(), servers=_list(a.servers, ("hearth", "llama-server")),
                 runs=a.runs or (2 if q else 3), threads=a.threads, parallel=1, ctx=a.ctx or (8192 if q else 32768),
                 wait_idle_s=a.wait_idle, max_foreign_cpu=a.max_foreign_cpu,
                 retries=a.retries if a.retries is not None else (0 if q else 2),
                 request_timeout_s=3600.0, startup_timeout_s=300.0, out_dir=a.out_dir, quick=q)
    plan = Plan(parts=_list(a.parts, PARTS), runs=s.runs, second_runs=a.second_runs or (1 if q else 3),
                variants=_list(a.variants, VARIANTS), conversations=a.conversations or (4 if q else 20),
                shared_fixture=a.shared_fixture, max_tokens=a.max_tokens, peer_cold_restart=a.peer_cold_restart)
    return s, plan


def fixture(name: str, quick: bool) -> dict[str, Any]:
    captured = load_fixture(name)
    return without_tools(captured) if quick else captured


async def run(s: Settings, plan: Plan, fixtures: list[str], result: dict[str, Any], keep: bool) -> None:
    root = work_dir()
    seed = root / "seed"
    result["state_root"] = str(root)
    raw: dict[str, dict[str, Any]] = result["servers"]
    try:
        for fx in fixtures:
            for name in s.servers:
                if s.wait_idle_s:
                    await asyncio.to_thread(wait_idle, s.wait_idle_s)
                seeds = name == "hearth" and fx == plan.shared_fixture and "shared" in plan.parts
                state = root / f"{name}-{fx}"
                log(f"{name} {fx}: start")
                try:
                    raw.setdefault(name, {})[fx] = await run_fixture(name, s, plan, fx, fixture(fx, s.quick),
                                                                     state, seed if seeds else None)
                except ServerUnavailable as e:
                    raw.setdefault(name, {})[fx] = {"status": "failed", "reason": str(e)[-1500:]}
                except Exception:  # one broken run must not sink the others
                    raw.setdefault(name, {})[fx] = {"status": "failed", "reason": traceback.format_exc()[-3000:]}
                if not keep:
                    shutil.rmtree(state, ignore_errors=True)
                save_json(result, s.out_dir, "prompt-cache")
        if "shared" in plan.parts and "hearth" in s.servers:
            log(f"shared prefix: {plan.conversations} conversations")
            tag = raw.get("hearth", {}).get(plan.shared_fixture, {}).get("tag")
            try:
                result["shared"] = await shared_prefix(s, plan, fixture(plan.shared_fixture, s.quick), tag,
                                                       seed if tag else None, root / "shared")
            except Exception:
                result["shared"] = {"status": "failed", "reason": traceback.format_exc()[-3000:]}
    finally:
        if keep:
            log(f"state directories kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def summarize(result: dict[str, Any], plan: Plan) -> None:
    raw = result["servers"]
    out: dict[str, dict[str, Any]] = {n: {fx: summary.summarize_fixture(n, r) for fx, r in per.items()}
                                      for n, per in raw.items()}
    if "llama-server" in out:
        out[summary.RAM_ONLY] = {fx: summary.ram_only(r) for fx, r in out["llama-server"].items()}
    result["summary"] = out
    result["ratios"] = summary.ratios(out)
    if "shared" in result:
        peer = raw.get("llama-server", {}).get(plan.shared_fixture)
        result["summary_shared"] = summary.shared_summary(result["shared"], peer)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def report(result: dict[str, Any], fixtures: list[str], plan: Plan, png: Path) -> None:
    summarize(result, plan)
    plot(result, fixtures, png)
    print(summary.table(result["summary"], fixtures))
    print(summary.shared_table(result.get("summary_shared") or {}))


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)  # unwinds through the blocks that stop the servers
    a = parse(argv)
    if a.report:
        earlier = json.loads(a.report.read_text())
        cfg = earlier["settings"]
        report(earlier, cfg["fixtures"], Plan(shared_fixture=cfg["shared_fixture"]), a.report.with_suffix(".png"))
        return 0
    s, plan = configure(a)
    fixtures = _list(a.fixtures, FIXTURES)
    os.environ["PYTHONPATH"] = str(REPO_ROOT)  # the Hearth measured is this checkout's
    result: dict[str, Any] = {
        "schema": 1, "timestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(), "model": str(s.model), "settings": {**s.to_json(), **plan.__dict__,
                                                                        "fixtures": fixtures},
        "complete": False, "servers": {}}
    asyncio.run(run(s, plan, fixtures, result, a.keep_state))
    result["complete"] = True
    summarize(result, plan)
    path, _ = save_json(result, s.out_dir, "prompt-cache")
    png = path.with_suffix(".png")
    report(result, fixtures, plan, png)
    shutil.copyfile(png, s.out_dir / "latest-prompt-cache.png")
    print(f"\nModel {s.model.name}, threads {s.threads}, one slot of {s.ctx} tokens, {plan.runs} runs per restart "
          f"kind, {plan.second_runs} second conversations per variant. JSON: {path}; plot: {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
