"""Medians of the raw records (measure.py), the issue's targets, the ratios and the markdown table.

Servers in the summary: `hearth`; `llama-server` as run (RAM cache on, slot 0 saved after the
first request and restored after every restart); `llama-server (RAM cache)`: llama-server with
nothing but its RAM cache, which a restart empties, so its first answer after a restart is its
cold prefill (taken from the cold measurement unless `--peer-cold-restart` measured it).
"""

from __future__ import annotations

from typing import Any

from bench.stats import median

RESTART_TARGET_S = 2.0  # the issue: the same request re-sent after a restart answers in <= 2 s
RAM_ONLY = "llama-server (RAM cache)"


def _med(rows: list[dict[str, Any]], key: str) -> float | None:
    return median([float(r[key]) for r in rows if r.get(key) is not None])


def _share(rows: list[dict[str, Any]]) -> float | None:
    return median([r["cached_tokens"] / r["prompt_tokens"] for r in rows
                   if r.get("cached_tokens") is not None and r.get("prompt_tokens")])


def _contaminated(record: dict[str, Any]) -> bool:
    """Others used more of the machine than --max-foreign-cpu during the measurement (bench/cpu.py)."""
    return bool((record.get("cpu") or {}).get("contaminated"))


def _phase(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"first_answer_s": _med(rows, "first_answer_s"), "ttft_s": _med(rows, "ttft_s"),
            "cached_share": _share(rows), "startup_s": median([r["restart"]["startup_s"] for r in rows]),
            "shutdown_s": median([r["restart"]["shutdown_s"] for r in rows]),
            "restore_s": median([r["restore"]["wall_s"] for r in rows if r.get("restore")]),
            # where the server says the prefix came from (Hearth's timings.cache_tier, where it sends one)
            "tiers": sorted({str((r.get("timings") or {}).get("cache_tier")) for r in rows
                             if (r.get("timings") or {}).get("cache_tier")}),
            "runs": len(rows), "contaminated": sum(_contaminated(r) for r in rows),
            # Hearth logs "ignoring prompt-cache ..." for every file it refuses (corrupt, foreign, half-written)
            "ignored_files": sum("ignoring" in line for r in rows for line in r["restart"].get("log", [])),
            "errors": sum(r.get("status") != 200 for r in rows)}


def _metric(record: dict[str, Any], part: str) -> float | None:
    """The sum of the /metrics samples whose name has `part` (Hearth's names may carry labels)."""
    values = [v for k, v in (record.get("cache_metrics") or {}).items() if part in k.split("{")[0]]
    return sum(values) if values else None


def disk_tier(name: str, fx: dict[str, Any], in_slot_s: float | None, cold_tps: float | None) -> dict[str, Any]:
    """Restore speed from the from-disk runs. llama-server: its own restore record (bytes read,
    tokens, restore_ms). Hearth: the bytes of the prompt's blocks and the tokens served from
    them over TTFT minus the in-slot TTFT (what the rest of the answer costs), and, where its
    /metrics has them, its own loaded bytes and load seconds (disk reads and checksums only)."""
    rows = [r for r in fx.get("from_disk", []) if r.get("status") == 200]
    if not rows:
        return {}
    out: dict[str, Any] = {}
    if name == "hearth":
        restore = [r["ttft_s"] - in_slot_s for r in rows if in_slot_s is not None and r.get("ttft_s")]
        seconds = median([t for t in restore if t > 0])
        bytes_, tokens = fx["disk"]["bytes"], _med(rows, "cached_tokens")
        loaded, load_s = _med([{"v": _metric(r, "loaded_bytes")} for r in rows], "v"), _med(
            [{"v": _metric(r, "load_seconds")} for r in rows], "v")
        if loaded and load_s:
            out["server_read_mb_s"] = loaded / load_s / 1e6
        out["restore_s"] = seconds
    else:
        got = [r["restore"] for r in rows if r.get("restore") and r["restore"].get("n_read")]
        seconds = median([g["timings"]["restore_ms"] / 1000 for g in got])
        bytes_, tokens = median([g["n_read"] for g in got]), median([g["n_restored"] for g in got])
        out["restore_s"] = seconds
    if seconds and bytes_ and tokens:
        out.update(bytes=bytes_, tokens=tokens, mb_s=bytes_ / seconds / 1e6, tokens_s=tokens / seconds)
        if cold_tps:
            out["vs_cold_prefill"] = out["tokens_s"] / cold_tps
    return out


def second_conversation(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r.get("status") == 200]
    firsts = [r for r in ok if r.get("first_difference") is not None and r.get("prompt_tokens")]
    out = {"ttft_s": _med(ok, "ttft_s"), "prompt_tokens": _med(ok, "prompt_tokens"),
           "cached_tokens": _med(ok, "cached_tokens"), "cached_share": _share(ok), "runs": len(rows),
           "contaminated": sum(_contaminated(r) for r in ok),
           "changed": rows[0].get("changed") if rows else None}
    bounds = [r["first_difference_at_least"] for r in ok if r.get("first_difference_at_least") is not None]
    if bounds:  # no block written for the new tokens: the difference is somewhere in the last few
        out["first_difference_at_least"] = min(bounds)
    if firsts:
        out["first_difference"] = median([r["first_difference"] for r in firsts])
        out["first_difference_share"] = median([r["first_difference"] / r["prompt_tokens"] for r in firsts])
        # The target: every token before the first difference served from the cache (the last
        # prompt token is always computed, for its logits).
        out["all_before_difference_cached"] = all(
            (r.get("cached_tokens") or 0) >= min(r["first_difference"], r["prompt_tokens"] - 1) for r in firsts)
    if "first_difference" in out or bounds:
        out["first_difference_at"] = (f"{out['first_difference']:,.0f}" if "first_difference" in out
                                      else f"≥ {min(bounds):,}")
    return out


def summarize_fixture(name: str, fx: dict[str, Any]) -> dict[str, Any]:
    if fx.get("status") != "ok":
        return {"status": fx.get("status", "failed"), "reason": fx.get("reason")}
    cold = fx["cold"]
    tokens, ttft = cold.get("prompt_tokens"), cold.get("ttft_s")
    out: dict[str, Any] = {"status": "ok", "prompt_tokens": tokens, "cold_ttft_s": ttft,
                           "cold_prefill_tps": tokens / ttft if tokens and ttft else None,
                           "cold_contaminated": _contaminated(cold),
                           "in_slot_ttft_s": _med(fx["in_slot"], "ttft_s"), "disk_bytes": fx["disk"]["bytes"]}
    for key in ("restart_graceful", "restart_kill", "from_disk", "restart_ram_only"):
        if fx.get(key):
            out[key] = _phase(fx[key])
    out["disk_tier"] = disk_tier(name, fx, out["in_slot_ttft_s"], out["cold_prefill_tps"])
    out["second"] = {v: second_conversation(rows) for v, rows in (fx.get("second") or {}).items()}
    out["contaminated"] = (int(out["cold_contaminated"]) + sum(_contaminated(r) for r in fx["in_slot"])
                           + sum(p["contaminated"] for k, p in out.items() if k.startswith(("restart", "from_disk")))
                           + sum(c["contaminated"] for c in out["second"].values()))
    if name == "hearth":
        out["targets"] = {
            f"{k}_within_{RESTART_TARGET_S:g}s": out[k]["first_answer_s"] is not None
            and out[k]["first_answer_s"] <= RESTART_TARGET_S for k in ("restart_graceful", "restart_kill") if k in out}
        out["targets"].update({f"second_{v}_cached_to_first_difference": s.get("all_before_difference_cached")
                               for v, s in out["second"].items()})
    return out


def ram_only(peer: dict[str, Any]) -> dict[str, Any]:
    """llama-server with only its RAM cache: empty after any restart, so every answer after one
    is a cold prefill (measured once with --peer-cold-restart, else the cold measurement)."""
    if peer.get("status") != "ok":
        return peer
    measured = peer.get("restart_ram_only", {}).get("first_answer_s")
    after = measured if measured is not None else peer["cold_ttft_s"]
    phase = {"first_answer_s": after, "ttft_s": after, "cached_share": 0.0, "derived": measured is None}
    return {"status": "ok", "prompt_tokens": peer["prompt_tokens"], "cold_ttft_s": peer["cold_ttft_s"],
            "in_slot_ttft_s": peer["in_slot_ttft_s"], "restart_graceful": phase, "restart_kill": phase,
            "from_disk": phase, "second": {v: {"ttft_s": after, "cached_share": 0.0, "derived": measured is None}
                                          for v in peer.get("second", {})}}


def shared_summary(shared: dict[str, Any], peer_fx: dict[str, Any] | None) -> dict[str, Any]:
    """Part e: disk for N conversations against N times one conversation's KV (Hearth's bytes
    per token × each one's prompt tokens), and what llama-server's slot files would take (its
    measured bytes per token of a saved slot, one whole file per conversation)."""
    convs = [c for c in shared.get("conversations", []) if c.get("prompt_tokens")]
    stored = shared.get("stored") or {}
    if not convs or not stored.get("tokens"):
        return {"status": "failed"}
    per_token = stored["kv_bytes"] / stored["tokens"]
    each = [c["prompt_tokens"] * per_token for c in convs]
    out: dict[str, Any] = {
        "conversations": len(convs), "disk_bytes": shared["disk"]["bytes"],
        "disk_allocated_bytes": shared["disk"]["allocated_bytes"], "blocks": stored["blocks"],
        "stored_tokens": stored["tokens"], "prompt_tokens_total": sum(c["prompt_tokens"] for c in convs),
        "kv_bytes_per_token": per_token, "one_kv_each_bytes": sum(each),
        "first_differences": [c.get("first_difference") for c in convs],
        "ttft_s": [c.get("ttft_s") for c in convs], "cached_tokens": [c.get("cached_tokens") for c in convs]}
    out["saving"] = out["one_kv_each_bytes"] / out["disk_bytes"] if out["disk_bytes"] else None
    save = (peer_fx or {}).get("persist") or {}
    if save.get("n_written") and save.get("n_saved"):
        out["llama_server_slot_files_bytes"] = sum(c["prompt_tokens"] for c in convs) * save["n_written"] / save[
            "n_saved"]
    return out


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per fixture, peer ÷ Hearth of each time (how many times faster Hearth answers)."""
    out: dict[str, Any] = {}
    hearth = summary.get("hearth", {})
    for fx, mine in hearth.items():
        if mine.get("status") != "ok":
            continue
        for peer in (p for p in summary if p != "hearth"):
            theirs = summary[peer].get(fx, {})
            if theirs.get("status") != "ok":
                continue
            r: dict[str, float] = {}
            for key in ("restart_graceful", "restart_kill", "from_disk"):
                a, b = (mine.get(key) or {}).get("first_answer_s"), (theirs.get(key) or {}).get("first_answer_s")
                if a and b:
                    r[key] = b / a
            for v, s in mine.get("second", {}).items():
                a, b = s.get("ttft_s"), (theirs.get("second", {}).get(v) or {}).get("ttft_s")
                if a and b:
                    r[f"second_{v}"] = b / a
            out.setdefault(fx, {})[peer] = r
    return out


def _f(v: Any, digits: int = 2, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "yes" if v else "no"
    return f"{v:,.{digits}f}{unit}"


def _get(record: dict[str, Any], path: tuple[str, ...]) -> Any:
    cur: Any = record
    for key in path:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return cur


class _Table:
    """One markdown table: a row per measure (a path into each server's summary), a column per
    server, then peer ÷ Hearth for the times."""

    def __init__(self, servers: list[str], cols: list[dict[str, Any]]) -> None:
        self.servers, self.cols = servers, cols
        self.peers = [n for n in servers if n != "hearth"]
        head = ["", *servers, *(f"{p} ÷ hearth" for p in self.peers)]
        self.lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]

    def row(self, label: str, *path: str, digits: int = 2, ratio: bool = False) -> None:
        vals = [_get(c, path) if c.get("status") == "ok" else None for c in self.cols]
        cells = [_f(v, digits) for v in vals]
        h = vals[self.servers.index("hearth")] if "hearth" in self.servers else None
        for p in self.peers:
            v = vals[self.servers.index(p)]
            cells.append(_f(v / h, 1, "×") if ratio and h and v else "")
        self.lines.append(f"| {label} | " + " | ".join(cells) + " |")


def table(summary: dict[str, dict[str, Any]], fixtures: list[str]) -> str:
    servers = [n for n in ("hearth", "llama-server", RAM_ONLY) if n in summary]
    out: list[str] = []
    for fx in fixtures:
        t = _Table(servers, [summary[n].get(fx, {}) for n in servers])
        t.row("prompt tokens", "prompt_tokens", digits=0)
        t.row("cold TTFT (s)", "cold_ttft_s", ratio=True)
        t.row("cold prefill (tok/s)", "cold_prefill_tps", digits=0)
        t.row("TTFT, prompt in the slot (s)", "in_slot_ttft_s")
        for key, label in (("restart_graceful", "after a graceful restart"), ("restart_kill", "after kill -9"),
                           ("from_disk", "after a restart, state files out of the page cache")):
            t.row(f"first answer {label} (s)", key, "first_answer_s", ratio=True)
        t.row("  cached share after a restart", "restart_graceful", "cached_share")
        t.row("restart: server ready after (s)", "restart_graceful", "startup_s")
        for v in sorted({v for c in t.cols for v in (c.get("second") or {})}):
            t.row(f"second conversation ({v}): TTFT (s)", "second", v, "ttft_s", ratio=True)
            t.row(f"  ({v}) cached share", "second", v, "cached_share")
            t.row(f"  ({v}) first difference at token", "second", v, "first_difference_at")
            t.row(f"  ({v}) first difference, share of the prompt", "second", v, "first_difference_share")
        t.row("disk tier: MB/s restored", "disk_tier", "mb_s", digits=0)
        t.row("disk tier: tokens/s restored", "disk_tier", "tokens_s", digits=0)
        t.row("  ÷ cold prefill tok/s", "disk_tier", "vs_cold_prefill", digits=0)
        t.row("measurements kept with others' CPU over the limit", "contaminated", digits=0)
        out += [f"\n**{fx}**\n", *t.lines]
    return "\n".join(out)


def shared_table(s: dict[str, Any]) -> str:
    if s.get("status") == "failed" or not s:
        return ""
    mb = 1e6
    lines = [f"\n**{s['conversations']} conversations sharing one prefix** (Claude Code, one task each)\n",
             "| | bytes | |", "|---|---|---|",
             f"| Hearth's prompt-cache directory | {s['disk_bytes'] / mb:,.0f} MB | {s['blocks']} blocks, "
             f"{s['stored_tokens']:,} tokens stored for {s['prompt_tokens_total']:,} prompt tokens |",
             f"| one KV per conversation (each prompt × {s['kv_bytes_per_token']:,.0f} B/token) | "
             f"{s['one_kv_each_bytes'] / mb:,.0f} MB | {_f(s['saving'], 1, '×')} Hearth's |"]
    if s.get("llama_server_slot_files_bytes"):
        lines.append(f"| llama-server `--slot-save-path`, one file per conversation | "
                     f"{s['llama_server_slot_files_bytes'] / mb:,.0f} MB | |")
    return "\n".join(lines)
