"""The plot: per fixture, the first answer (log seconds) cold, after each kind of restart and for
the second conversations, one bar per server; and part e's disk bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.prompt_cache.summary import RAM_ONLY

COLORS = {"hearth": "#2a7ab0", "llama-server": "#d08c2a", RAM_ONLY: "#999999"}


def _bars(fx: dict[str, Any]) -> dict[str, float | None]:
    if fx.get("status") != "ok":
        return {}
    out: dict[str, float | None] = {"cold": fx.get("cold_ttft_s")}
    for key, label in (("restart_graceful", "graceful\nrestart"), ("restart_kill", "kill -9"),
                       ("from_disk", "restart,\nno page cache")):
        out[label] = (fx.get(key) or {}).get("first_answer_s")
    for v, s in (fx.get("second") or {}).items():
        out[f"2nd conv.\n{v}"] = s.get("ttft_s")
    return out


def plot(result: dict[str, Any], fixtures: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary: dict[str, dict[str, Any]] = result.get("summary", {})
    shared = result.get("summary_shared") or {}
    n = len(fixtures) + (1 if shared.get("disk_bytes") else 0)
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.6), squeeze=False)
    servers = [s for s in ("hearth", "llama-server", RAM_ONLY) if s in summary]
    for ax, fx in zip(axes[0], fixtures, strict=False):
        bars = {s: _bars(summary[s].get(fx, {})) for s in servers}
        labels = list(dict.fromkeys(k for b in bars.values() for k in b))
        width = 0.8 / max(1, len(servers))
        for i, s in enumerate(servers):
            xs = [j + (i - (len(servers) - 1) / 2) * width for j in range(len(labels))]
            ys = [bars[s].get(label) or 0 for label in labels]
            ax.bar(xs, ys, width, label=s, color=COLORS.get(s))
            for x, y in zip(xs, ys, strict=True):
                if y:
                    ax.annotate(f"{y:.2g}", (x, y), ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("first answer (s, log)")
        ax.set_title(f"{fx}", fontsize=9)
        ax.legend(fontsize=7)
    if shared.get("disk_bytes"):
        ax = axes[0][-1]
        items = [("Hearth\nprompt cache", shared["disk_bytes"], COLORS["hearth"]),
                 ("one KV per\nconversation", shared["one_kv_each_bytes"], "#999999")]
        if shared.get("llama_server_slot_files_bytes"):
            items.append(("llama-server\nslot files", shared["llama_server_slot_files_bytes"], COLORS["llama-server"]))
        ax.bar([i[0] for i in items], [i[1] / 1e6 for i in items], color=[i[2] for i in items])
        ax.set_ylabel("disk (MB)")
        ax.set_title(f"{shared['conversations']} conversations sharing one prefix", fontsize=9)
    fig.suptitle(f"{Path(result['model']).name}, {result['settings']['threads']} threads; medians", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
