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
        ratios[peer] = per_metric
    return ratios


def write_json(result: Result, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = re.sub(r"[^0-9T]", "", result["timestamp"])[:15]
    path = out_dir / f"bench-{stamp}.json"
    text = json.dumps(result, indent=2, default=str)
    path.write_text(text)
    latest = out_dir / "latest.json"
    latest.write_text(text)
    return path, latest


def metric_names(servers: dict[str, Result]) -> list[str]:
    names: list[str] = []
    for res in servers.values():
        for name in res.get("metrics", {}):
            if name not in names:
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
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for metric in metric_names({n: servers[n] for n in ok}):
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
    return "\n".join(lines)


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
