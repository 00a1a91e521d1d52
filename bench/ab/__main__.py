"""`python -m bench.ab`: Hearth against llama-server, servers side by side, alternated round by
round on the same requests; writes results/ab-<stamp>.json (+ latest-ab.json), a plot of the
per-round ratios, and prints the issue's table (markdown)."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from bench.ab.cancel import cancel_section
from bench.ab.sections import AbConfig, churn, decode, kv_types, speculative
from bench.ab.structured import structured
from bench.config import RESULTS_DIR, Settings, default_model
from bench.machine import machine_info

SECTIONS = ("decode", "churn", "cancel", "spec", "kv", "structured")


def _log(msg: str) -> None:
    print(f"[ab {dt.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__)
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=10, help="decode: rounds (every server once per round)")
    p.add_argument("--instances", type=int, default=1,
                   help="decode: fresh sets of server processes (start order rotated), --rounds each")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--streams", type=int, default=8, help="decode: concurrent streams (also the slots)")
    p.add_argument("--churn-clients", type=int, default=0,
                   help="churn: clients sending back to back on --streams slots (default: --streams - 1)")
    p.add_argument("--churn-seconds", type=float, default=20.0, help="churn: seconds per server per round")
    p.add_argument("--ctx", type=int, default=2048, help="decode: tokens per slot")
    p.add_argument("--cancel-runs", type=int, default=30)
    p.add_argument("--cancel-peer-runs", type=int, default=3, help="llama-server disconnects (each ~ a full prefill)")
    p.add_argument("--cancel-prompt-tokens", type=int, default=4000)
    p.add_argument("--spec-rounds", type=int, default=3)
    p.add_argument("--spec-max-tokens", type=int, default=384)
    p.add_argument("--spec-workloads", default="rewrite_file,echo_json,continue_code,chat")
    p.add_argument("--spec-servers", default=None,
                   help="spec: the servers beside hearth (e.g. hearth-nospec); all of them by default")
    p.add_argument("--kv-rounds", type=int, default=3)
    p.add_argument("--kv-prompts", type=int, default=16)
    p.add_argument("--compile-runs", type=int, default=50, help="structured: grammar compiles timed per kind")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    return p.parse_args(argv)


def _settings(a: argparse.Namespace, parallel: int, ctx: int) -> Settings:
    return Settings(model=a.model or default_model(), threads=a.threads, parallel=parallel, ctx=ctx, out_dir=a.out_dir)


async def run(a: argparse.Namespace) -> dict[str, Any]:
    sections = [x.strip() for x in a.sections.split(",") if x.strip()]
    bad = [x for x in sections if x not in SECTIONS]
    if bad:
        raise SystemExit(f"unknown section(s): {', '.join(bad)}")
    cfg = AbConfig(
        rounds=a.rounds,
        instances=a.instances,
        max_tokens=a.max_tokens,
        streams=a.streams,
        churn_clients=a.churn_clients or max(1, a.streams - 1),
        churn_seconds=a.churn_seconds,
        spec_rounds=a.spec_rounds,
        spec_max_tokens=a.spec_max_tokens,
        kv_rounds=a.kv_rounds,
        kv_prompts=a.kv_prompts,
        spec_workloads=[w.strip() for w in a.spec_workloads.split(",") if w.strip()],
        spec_servers=[x.strip() for x in a.spec_servers.split(",") if x.strip()] if a.spec_servers else None,
    )
    out: dict[str, Any] = {
        "schema": 1,
        "timestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "argv": sys.argv[1:],
        "load_before": os.getloadavg()[0],
    }
    runs = {
        "decode": lambda: decode(_settings(a, a.streams, a.ctx), cfg, _log),
        "churn": lambda: churn(_settings(a, a.streams, a.ctx), cfg, _log),
        "cancel": lambda: cancel_section(
            _settings(a, 2, max(a.ctx, a.cancel_prompt_tokens + 512)),
            a.cancel_runs,
            a.cancel_peer_runs,
            a.cancel_prompt_tokens,
            _log,
        ),
        "spec": lambda: speculative(_settings(a, 1, 8192), cfg, _log),
        "kv": lambda: kv_types(_settings(a, 2, 4096), cfg, _log),
        "structured": lambda: structured(_settings(a, 1, a.ctx), cfg, _log, a.compile_runs),
    }
    for name in SECTIONS:
        if name in sections:
            out[name] = await runs[name]()
            _save_partial(out, a.out_dir)
    return out


def _save_partial(out: dict[str, Any], out_dir: Path) -> None:
    """A section's results survive an interrupted run (the final write replaces this)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "partial-ab.json").write_text(json.dumps(out, indent=1))


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def table(r: dict[str, Any]) -> str:
    rows = ["| metric | value | |", "|---|---|---|"]
    d = r.get("decode")
    if d:
        for scope, key, label in (
            ("single", "decode", "single-stream decode"),
            ("single", "e2e", "single-stream e2e"),
            ("multi", None, f"aggregate, {d['multi']['streams']} streams"),
        ):
            for name in ("hearth", "hearth-nospec"):
                k = f"{name}/llama-server {key}" if key else f"{name}/llama-server"
                sm = d[scope][k]
                rows.append(
                    f"| {label}, {name} / llama-server (median of per-round ratios) | "
                    f"**{_f(sm['median'])}×** | p10 {_f(sm['p10'])}, p90 {_f(sm['p90'])}, n {sm['n']} |"
                )
    ch = r.get("churn")
    if ch:
        sm = ch["hearth-nospec/llama-server"]
        rows.append(
            f"| decode under churn, {ch['clients']} clients on {ch['slots']} slots, hearth-nospec / llama-server | "
            f"**{_f(sm['median'])}×** | p10 {_f(sm['p10'])}, p90 {_f(sm['p90'])}, n {sm['n']} |"
        )
    c = r.get("cancel")
    if c:
        for key, row in c["rows"].items():
            extra = f", neighbour identical {row['neighbour_identical']}" if "neighbour_identical" in row else ""
            rows.append(
                f"| cancel in a {c['prompt_tokens']}-token prefill, {key} | p50 {_f(row['p50_ms'], '{:.1f}')} ms,"
                f" p99 **{_f(row['p99_ms'], '{:.1f}')} ms** | tokens after mean "
                f"{_f(row['tokens_after_mean'])} max {_f(row['tokens_after_max'], '{:.0f}')}, "
                f"interrupted {row['interrupted']}/{row['runs']}{extra} |"
            )
    sp = r.get("spec")
    if sp:
        for w, info in sp["workloads"].items():
            best = info["best_llama_ngram"]
            acc, up = info["acceptance"], info["speedup"]
            drafted, generated = info.get("drafted", {}), info.get("generated", {})
            counts = f"drafted {drafted.get('hearth', '–')} for {generated.get('hearth', '–')} generated"
            if "hearth/hearth-nospec" in up:
                sm = up["hearth/hearth-nospec"]
                rows.append(
                    f"| spec {w}: hearth / hearth-nospec | **{_f(sm['median'])}×** | p10 {_f(sm['p10'])}, "
                    f"p90 {_f(sm['p90'])}, n {sm['n']}; hearth acceptance {_f(acc['hearth'])}, {counts} |"
                )
            if "hearth/llama-server" in up:
                rows.append(
                    f"| spec {w}: hearth / llama-server default | **{_f(up['hearth/llama-server']['median'])}×**"
                    f" | hearth acceptance {_f(acc['hearth'])} |"
                )
            if best is not None:
                rows.append(
                    f"| spec {w}: hearth / {best} (best n-gram mode) | **{_f(up[f'hearth/{best}']['median'])}×**"
                    f" | its acceptance {_f(acc.get(best))} |"
                )
    kv = r.get("kv")
    if kv:
        for t, info in kv["types"].items():
            rows.append(
                f"| KV {t}: bytes per token, sessions per GiB ({kv['session_tokens_assumed']} tokens each) | "
                f"{info['bytes_per_token']:.0f} B, **{info['sessions_per_gib']:.1f}** | identical greedy tokens "
                f"vs f16 {_f(info['identical_token_fraction'])} (prefix {_f(info['identical_prefix_fraction'])}),"
                f" decode vs f16 {_f(info['decode_vs_f16']['median'])}× |"
            )
    st = r.get("structured")
    if st:
        for kind, label in (("json", "JSON schema"), ("tool", "forced tool call")):
            h, ls, vs = st[f"hearth {kind}/plain"], st[f"llama-server {kind}/plain"], st[f"hearth/llama-server {kind}"]
            comp = st["compile"][kind]
            rows.append(f"| structured {label}: hearth / its plain decode | **{_f(h['median'])}×** | "
                        f"llama-server / its plain {_f(ls['median'])}×; hearth / llama-server constrained "
                        f"**{_f(vs['median'])}×** (n {vs['n']}) |")
            rows.append(f"| structured {label}: compile, uncached / cached p50 | "
                        f"**{_f(comp['uncached_ms']['p50'])} ms / {_f(comp['cached_ms']['p50'], '{:.3f}')} ms** | "
                        f"p90 {_f(comp['uncached_ms']['p90'])} / {_f(comp['cached_ms']['p90'], '{:.3f}')} ms |")
    return "\n".join(rows)


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: list[tuple[str, list[float]]] = []
    if "decode" in r:
        d = r["decode"]
        series += [
            ("1 stream", d["single"]["hearth/llama-server decode"]["samples"]),
            (f"{d['multi']['streams']} streams", d["multi"]["hearth/llama-server"]["samples"]),
        ]
    if "churn" in r:
        series.append((f"churn {r['churn']['clients']}/{r['churn']['slots']}",
                       r["churn"]["hearth-nospec/llama-server"]["samples"]))
    for w, info in (r.get("spec") or {}).get("workloads", {}).items():
        if "hearth/llama-server" in info["speedup"]:
            series.append((f"spec {w}", info["speedup"]["hearth/llama-server"]["samples"]))
    if not series:
        return
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, (_label, values) in enumerate(series):
        ax.scatter([i] * len(values), values, alpha=0.6)
    ax.set_xticks(range(len(series)), [s[0] for s in series], rotation=20)
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_ylabel("Hearth / llama-server, per round")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    # SIGTERM (e.g. from `timeout`) unwinds through the `async with` blocks, which stop the servers.
    signal.signal(signal.SIGTERM, _interrupt)
    a = parse(argv)
    result = asyncio.run(run(a))
    a.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    path = a.out_dir / f"ab-{stamp}.json"
    path.write_text(json.dumps(result, indent=1))
    (a.out_dir / "latest-ab.json").write_text(json.dumps(result, indent=1))
    plot(result, a.out_dir / "latest-ab.png")
    md = table(result)
    (a.out_dir / "latest-ab.md").write_text(md + "\n")
    _log(f"wrote {path}, latest-ab.json/.png/.md")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
