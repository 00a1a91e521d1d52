"""Turn per-server results into the JSON file, the PNG plot and a markdown table."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

Result = dict[str, Any]


def compute_ratios(servers: dict[str, Result], baseline: str) -> dict[str, dict[str, dict[str, Any]]]:
    """baseline/peer of each metric's median, with whether the baseline is the better one."""
    base = servers.get(baseline)
    if not base or base.get("status") != "ok":
        return {}
    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    for peer, res in servers.items():
        if peer == baseline or res.get("status") != "ok":
            continue
        per_metric: dict[str, dict[str, Any]] = {}
        for metric, mine in base["metrics"].items():
            theirs = res["metrics"].get(metric)
            if not theirs or not mine["median"] or not theirs["median"]:
                continue
            ratio = mine["median"] / theirs["median"]
            better = ratio > 1 if mine["higher_is_better"] else ratio < 1
            per_metric[metric] = {
                "ratio": round(ratio, 4),
                "higher_is_better": mine["higher_is_better"],
                f"{baseline}_better": better,
            }
            if mine.get("p99") and theirs.get("p99"):
                per_metric[metric]["ratio_p99"] = round(mine["p99"] / theirs["p99"], 4)
        ratios[peer] = per_metric
    return ratios


def output_prefix(result: Result) -> str:
    """`bench` for throughput runs; `cancel` for cancel-only runs, so they do not replace latest.json."""
    return "cancel" if result["settings"].get("workloads") == ["cancel"] else "bench"


def save_json(result: Result, out_dir: Path, name: str, latest: str | None = None, indent: int = 1
              ) -> tuple[Path, Path]:
    """A run's JSON twice: `NAME-<timestamp>.json` (this run's own, git-ignored) and the one the
    docs quote, `latest-NAME.json` (or `latest`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = re.sub(r"[^0-9T]", "", result["timestamp"])[:15]
    path = out_dir / f"{name}-{stamp}.json"
    text = json.dumps(result, indent=indent, default=str)
    path.write_text(text)
    latest_path = out_dir / (latest or f"latest-{name}.json")
    latest_path.write_text(text)
    return path, latest_path


def write_json(result: Result, out_dir: Path) -> tuple[Path, Path]:
    prefix = output_prefix(result)
    return save_json(result, out_dir, prefix, "latest.json" if prefix == "bench" else None, indent=2)


def metric_names(servers: dict[str, Result], table: str | None = None) -> list[str]:
    """Metric names in first-seen order; `table` picks those whose record has that `table` key."""
    names: list[str] = []
    for res in servers.values():
        for name, rec in res.get("metrics", {}).items():
            if name not in names and rec.get("table") == table:
                names.append(name)
    return names


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def markdown_table(result: Result) -> str:
    servers: dict[str, Result] = result["servers"]
    baseline: str = result["baseline"]
    ok = [n for n, r in servers.items() if r.get("status") == "ok"]
    peers = list(result["ratios"])
    head = ["metric", *[f"{n} (median)" for n in ok], *[f"{baseline}/{p}" for p in peers]]
    names = metric_names({n: servers[n] for n in ok})
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] if names else []
    for metric in names:
        unit = next(servers[n]["metrics"][metric]["unit"] for n in ok if metric in servers[n]["metrics"])
        hib = next(servers[n]["metrics"][metric]["higher_is_better"] for n in ok if metric in servers[n]["metrics"])
        label = f"{metric} ({unit}, {'higher' if hib else 'lower'} is better)"
        cells = [_fmt(servers[n]["metrics"].get(metric, {}).get("median")) for n in ok]
        ratio_cells = [_fmt(result["ratios"][p].get(metric, {}).get("ratio")) for p in peers]
        lines.append("| " + " | ".join([label, *cells, *ratio_cells]) + " |")
    failed = [
        f"{n}: {r.get('error', '')[:200].splitlines()[0] if r.get('error') else 'failed'}"
        for n, r in servers.items()
        if r.get("status") != "ok"
    ]
    s = result["settings"]
    lines.append("")
    lines.append(
        f"Model `{Path(s['model']).name}`, threads {s['threads']}, parallel {s['parallel']}, "
        f"ctx/slot {s['ctx']}, max_tokens {s['max_tokens']}, runs {s['runs']}."
    )
    for n in ok:
        cont = servers[n].get("contention", {})
        if cont.get("retries"):
            lines.append(f"{n}: {cont['retries']} re-runs over {cont['rounds']} measurements (CPU used by others).")
        if cont.get("contaminated_rounds"):
            lines.append(f"Warning: {n}: {cont['contaminated_rounds']} measurements still shared the CPU with others.")
    for f in failed:
        lines.append(f"Not measured: {f}")
    cancel = cancel_table(result)
    if cancel:
        lines += ["", cancel]
    return "\n".join(lines)


def cancel_table(result: Result) -> str:
    """One row per server, method and phase of the cancel workload; empty if it did not run."""
    servers = {n: r for n, r in result["servers"].items() if r.get("status") == "ok"}
    rows: list[str] = []
    for n, res in servers.items():
        m = res.get("metrics", {})
        for key in ("cancel_decode", "cancel_prefill", "disconnect_decode", "disconnect_prefill"):
            lat, tok = m.get(f"{key}_latency_ms"), m.get(f"{key}_tokens_after")
            if not lat or not tok:
                continue
            method, phase = key.split("_")
            ok_lat = "yes" if lat.get("target_met") else "no"
            ok_tok = "yes" if tok.get("target_met") else "no"
            rows.append(
                f"| {n} | {method} | {phase} | {lat['n']} | {lat.get('contaminated', 0)} | "
                f"{_fmt(lat['median'])} | {_fmt(lat['p99'])} | {_fmt(lat['max'])} | "
                f"{_fmt(tok['mean'])} | {_fmt(tok['max'])} | {ok_lat} / {ok_tok} |"
            )
    if not rows:
        return ""
    s = result["settings"]
    head = [
        "| server | method | phase | runs | contaminated | latency p50 (ms) | p99 (ms) | max (ms) "
        "| tokens after: mean | max | p99 < 50 ms / <= 1 token |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = [
        "",
        f"Decode: trigger after {s['cancel_after_tokens']} tokens; prefill: ~{s['cancel_prompt_tokens']}-token "
        f"prompt (capped to ctx {s['ctx']}), trigger {s['cancel_delay_ms'][0]:.0f}-{s['cancel_delay_ms'][1]:.0f} ms "
        f"after sending; idle polled every {s['cancel_poll_ms']:g} ms.",
    ]
    for n, res in servers.items():
        lp = res.get("workloads", {}).get("cancel", {}).get("raw", {}).get("long_prompt")
        if lp:
            notes.append(
                f"{n}: prefill prompt {lp.get('prompt_tokens')} tokens, full-prefill TTFT {_fmt(lp.get('ttft_ms'))} ms."
            )
    base = result.get("baseline", "hearth")
    for peer, per in result.get("ratios", {}).items():
        for phase in ("decode", "prefill"):
            r = per.get(f"disconnect_{phase}_latency_ms")
            if r:
                notes.append(
                    f"{base}/{peer} disconnect {phase} latency: p50 {_fmt(r['ratio'])}, p99 {_fmt(r.get('ratio_p99'))}."
                )
    return "\n".join(head + rows + notes)


def plot(result: Result, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = {n: r for n, r in result["servers"].items() if r.get("status") == "ok"}
    names = list(servers)
    conc = [c for c in result["settings"]["concurrency"]]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    panels = [
        ("ttft_ms", "TTFT (ms, lower better)"),
        ("tpot_ms", "Time per output token (ms, lower better)"),
        ("single_stream_tps", "Single-stream tok/s (higher better)"),
    ]
    colors = [f"C{i}" for i in range(len(names))]
    for ax, (metric, title) in zip(axes, panels, strict=False):
        values = [servers[n]["metrics"].get(metric, {}).get("median") or 0 for n in names]
        bars = ax.bar(names, values, color=colors)
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    ax = axes[3]
    width = 0.8 / max(len(names), 1)
    for i, n in enumerate(names):
        vals = [servers[n]["metrics"].get(f"aggregate_tps_c{c}", {}).get("median") or 0 for c in conc]
        xs = [j + i * width for j in range(len(conc))]
        bars = ax.bar(xs, vals, width=width, label=n, color=colors[i])
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(conc))], [f"{c} streams" for c in conc])
    ax.set_title("Aggregate tok/s (higher better)", fontsize=9)
    if names:
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{Path(result['settings']['model']).name}, {result['settings']['threads']} threads "
        f"- medians of {result['settings']['runs']} runs",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
