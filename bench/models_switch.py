"""Many models in one server (issue 26): what loading on demand costs, Hearth beside llama-server's
router mode (the same llama.cpp, built by scripts/build_llama_server.sh).

    .venv/bin/python -m bench.models_switch                 # 5 runs of each measure
    .venv/bin/python -m bench.models_switch --runs 2        # smoke

Two models in a folder of the bench's own: A, the default model (SmolLM2-135M, a link to the
file Hearth serves as its default), and B, the 32k coder model (Qwen2.5-Coder-0.5B, installed by
scripts/setup_agents.sh), copied there so that no other process holds its pages. Each server
serves that folder (Hearth: --models-dir, where A is its default model; llama-server: router
mode, --models-dir) with the same threads, one slot and the same context. Measured, per server:

- ttft_cold_s: time to the first token of a streamed chat request for B when B is not loaded and
  its file is not in the page cache (dropped with posix_fadvise(POSIX_FADV_DONTNEED), checked with
  fincore: the bytes still cached are recorded beside each sample);
- ttft_cached_s: the same with B's file in the page cache (read whole just before);
- ttft_loaded_s: the same with B loaded (the floor the two above are compared with);
- switch_s: with --models-max 1, requests alternating A, B, A, B, ...: each one's time to first
  token, which includes unloading the other model and loading its own (page-cached);
- rss_mib: the server's resident memory (the process and its children: llama-server's router runs
  each model in a child process) with no model, A, and A and B loaded (--models-max 2).

Medians of --runs samples each. The machine is shared: the load average is recorded before each
measure. Results: bench/results/models-switch-<stamp>.json, latest-models-switch.json and a plot.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.config import RESULTS_DIR
from bench.machine import machine_info
from bench.servers import free_port, llama_server_binary

PROMPT = [{"role": "user", "content": "Name one colour of the rainbow."}]


def log(msg: str) -> None:
    print(f"[models-switch] {msg}", file=sys.stderr, flush=True)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---- page cache ---------------------------------------------------------------------------------


def drop_page_cache(path: Path) -> None:
    """Drop the file's pages from the page cache (root, or its owner; pages some process still
    maps stay: the bench's own copies are mapped by nobody once their model is unloaded)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fill_page_cache(path: Path) -> None:
    with path.open("rb") as f:
        while f.read(16 << 20):
            pass


def cached_bytes(path: Path) -> int | None:
    """How much of the file is in the page cache now (util-linux fincore), None without it."""
    if shutil.which("fincore") is None:
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, timeout=30)
    try:
        return int(out.stdout.split()[0])
    except (IndexError, ValueError):
        return None


# ---- memory -------------------------------------------------------------------------------------


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants (/proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


# ---- servers ------------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    ids: dict[str, str]  # "A"/"B" -> the server's id for that model

    def models(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/v1/models" if self.name == "hearth" else f"{self.url}/models", timeout=30)
        r.raise_for_status()
        return list(r.json()["data"])

    def status(self, which: str) -> str:
        card = next(m for m in self.models() if m["id"] == self.ids[which])
        status = card["status"]
        return str(status["value"] if isinstance(status, dict) else status)

    def wait_status(self, which: str, value: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.status(which) != value:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {which} never became {value}")
            time.sleep(0.05)

    def load(self, which: str) -> None:
        r = httpx.post(f"{self.url}/models/load", json={"model": self.ids[which]}, timeout=300)
        if r.status_code >= 400 and "already" not in r.text:
            raise RuntimeError(f"{self.name}: load {which}: {r.status_code} {r.text[:300]}")
        self.wait_status(which, "loaded")

    def unload(self, which: str) -> None:
        if self.status(which) == "unloaded":
            return
        r = httpx.post(f"{self.url}/models/unload", json={"model": self.ids[which]}, timeout=300)
        if r.status_code >= 400:
            raise RuntimeError(f"{self.name}: unload {which}: {r.status_code} {r.text[:300]}")
        self.wait_status(which, "unloaded")

    def ttft(self, which: str) -> float:
        """Seconds from sending a streamed chat request to its first content token."""
        body = {"model": self.ids[which], "messages": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
        t0 = time.perf_counter()
        first = None
        with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, timeout=600) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{self.name}: {which}: HTTP {r.status_code}: {r.read()[:300]!r}")
            for line in r.iter_lines():
                if first is None and line.startswith("data: {"):
                    delta = (json.loads(line[6:]).get("choices") or [{}])[0].get("delta") or {}
                    if delta.get("content"):
                        first = time.perf_counter() - t0
        if first is None:
            raise RuntimeError(f"{self.name}: {which}: no token came")
        return first

    def rss(self) -> int:
        return tree_rss(self.proc.pid)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        except ProcessLookupError:
            pass


def start(name: str, argv: list[str], env: dict[str, str], work: Path, files: dict[str, Path],
          models_max: int) -> Server:
    port = free_port()
    log_path = work / f"{name}-max{models_max}-{port}.log"
    argv = [*argv, "--port", str(port)]
    with log_path.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    server = Server(name, proc, url, log_path, {})
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            data = server.models()
            break
        except (httpx.HTTPError, KeyError, ValueError):
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"{name} never answered: {log_path.read_text()[-2000:]}") from None
            time.sleep(0.2)
    by_path = {}
    for m in data:
        path = (m.get("meta") or {}).get("path") if name == "hearth" else m.get("path")
        if path:
            by_path[str(Path(path).resolve())] = m["id"]
    ids = {m["id"] for m in data}
    # by the file a model was loaded from; else by its file's stem (a router lists models by it)
    server.ids = {which: by_path.get(str(p.resolve())) or (p.stem if p.stem in ids else "")
                  for which, p in files.items()}
    if not all(server.ids.values()):
        server.stop()
        raise RuntimeError(f"{name}: models {files} not found in its list {sorted(ids)}")
    log(f"{name} (--models-max {models_max}) on {url}: {server.ids}")
    return server


def hearth_argv(folder: Path, s: argparse.Namespace, models_max: int) -> list[str]:
    exe = Path(sys.executable).parent / "hearth"
    return [str(exe), "serve", "--host", "127.0.0.1", "--threads", str(s.threads), "--parallel", "1",
            "--ctx", str(s.ctx), "--models-dir", str(folder), "--models-max", str(models_max)]


def llama_argv(exe: Path, folder: Path, s: argparse.Namespace, models_max: int) -> list[str]:
    return [str(exe), "--models-dir", str(folder), "--models-max", str(models_max), "--host", "127.0.0.1",
            "-t", str(s.threads), "-np", "1", "-c", str(s.ctx)]


def router_support(exe: Path | None) -> tuple[bool, str]:
    """Whether this llama-server has router mode (--models-dir and --models-max in its --help)."""
    if exe is None:
        return False, "llama-server is not built here (scripts/build_llama_server.sh)"
    try:
        out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{exe} --help failed: {e}"
    text = out.stdout + out.stderr
    if "--models-dir" in text and "--models-max" in text:
        return True, f"{exe}: --help lists --models-dir and --models-max (router mode)"
    return False, f"{exe}: --help has no --models-dir/--models-max: no router mode in this build"


# ---- measures -----------------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 4) if values else None, "n": len(values),
            "samples": [round(v, 4) for v in values]}


def measure_loads(server: Server, files: dict[str, Path], runs: int) -> dict[str, Any]:
    """--models-max 2: B's first token cold, page-cached and loaded; RSS with 0, 1, 2 models."""
    out: dict[str, Any] = {"load_avg_before": load()}
    for which in ("A", "B"):
        server.unload(which)
    rss = {"none": server.rss()}
    server.load("A")
    rss["A"] = server.rss()
    server.load("B")
    rss["A+B"] = server.rss()
    out["rss_mib"] = {k: round(v / 2**20, 1) for k, v in rss.items()}

    cold, cold_cached, cached = [], [], []
    for _ in range(runs):
        server.unload("B")
        drop_page_cache(files["B"])
        cold_cached.append(cached_bytes(files["B"]))
        cold.append(server.ttft("B"))
        server.unload("B")
        fill_page_cache(files["B"])
        cached.append(server.ttft("B"))
    loaded = [server.ttft("B") for _ in range(runs)]
    out["ttft_cold_s"] = {**summary(cold), "file_bytes_cached_at_send": cold_cached,
                          "file_bytes": files["B"].stat().st_size}
    out["ttft_cached_s"] = summary(cached)
    out["ttft_loaded_s"] = summary(loaded)
    return out


def measure_switch(server: Server, runs: int) -> dict[str, Any]:
    """--models-max 1: alternate A and B; each request's first token includes the other's unload
    and its own load (files page-cached)."""
    out: dict[str, Any] = {"load_avg_before": load()}
    server.ttft("A")  # A loaded, B not
    to_b, to_a = [], []
    for _ in range(runs):
        to_b.append(server.ttft("B"))
        to_a.append(server.ttft("A"))
    out["switch_to_B_s"] = summary(to_b)
    out["switch_to_A_s"] = summary(to_a)
    out["switch_s"] = summary(to_a + to_b)
    return out


def run_server(name: str, argv_for: Callable[[int], list[str]], env: dict[str, str], work: Path,
               files: dict[str, Path], runs: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    phases: tuple[tuple[int, Callable[[Server], dict[str, Any]]], ...] = (
        (2, lambda s: measure_loads(s, files, runs)), (1, lambda s: measure_switch(s, runs)))
    for models_max, measure in phases:
        server = start(name, argv_for(models_max), env, work, files, models_max)
        try:
            result.update(measure(server))
        except Exception as e:
            log(f"{name}: {e}")
            result.setdefault("errors", []).append(f"--models-max {models_max}: {e}")
            result.setdefault("log_tail", {})[models_max] = server.log_path.read_text()[-2000:]
        finally:
            server.stop()
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = [n for n, r in result["servers"].items() if "ttft_cold_s" in r]
    measures = [("ttft_cold_s", "B cold file"), ("ttft_cached_s", "B page-cached"), ("switch_s", "switch (max 1)"),
                ("ttft_loaded_s", "B loaded")]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    width = 0.8 / max(1, len(servers))
    for i, name in enumerate(servers):
        r = result["servers"][name]
        values = [(r.get(k) or {}).get("median") or 0 for k, _ in measures]
        ax.bar([x + i * width for x in range(len(measures))], values, width, label=name)
        rss = r.get("rss_mib", {})
        ax2.bar([x + i * width for x in range(len(rss))], list(rss.values()), width, label=name)
        ax2.set_xticks([x + width * (len(servers) - 1) / 2 for x in range(len(rss))], list(rss))
    ax.set_xticks([x + width * (len(servers) - 1) / 2 for x in range(len(measures))], [m for _, m in measures])
    ax.set_ylabel("time to first token, median (s)")
    ax.set_title("first token when the model must load")
    ax2.set_ylabel("RSS (MiB)")
    ax2.set_title("memory by models loaded")
    for a in (ax, ax2):
        a.legend()
        a.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--servers", default="hearth,llama-server")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    s = ap.parse_args()

    from hearth import catalog
    from hearth.models import embedded_model_path

    coder = catalog.installed_path(catalog.QWEN_CODER)
    if not coder.is_file():
        sys.exit(f"{catalog.QWEN_CODER.id} is not installed: scripts/setup_agents.sh")
    work = Path(tempfile.mkdtemp(prefix="models-switch-"))
    folder = work / "models"
    folder.mkdir()
    files = {"A": folder / "smollm2.gguf", "B": folder / "coder.gguf"}
    files["A"].symlink_to(embedded_model_path())  # Hearth's default model, the same file (never dropped)
    shutil.copyfile(coder, files["B"])
    env = {**os.environ, "HEARTH_HOME": str(work / "home")}
    exe = llama_server_binary()
    router, router_note = router_support(exe)
    log(router_note)

    result: dict[str, Any] = {
        "bench": "models-switch", "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(), "load_avg_start": load(),
        "settings": {"runs": s.runs, "threads": s.threads, "ctx": s.ctx, "slots": 1, "max_tokens": 4,
                     "models": {k: {"file": p.name, "bytes": p.stat().st_size} for k, p in files.items()}},
        "llama_server_router": {"supported": router, "note": router_note}, "servers": {},
        "notes": ["cold: the file is dropped from this machine's page cache (fincore: bytes still cached, per "
                  "sample); on a virtual disk the host may cache it too, so only a run's first cold sample "
                  "may read the real disk"],
    }
    wanted = s.servers.split(",")
    try:
        if "hearth" in wanted:
            # Hearth's default model is the same file as A: its id there is found by path
            result["servers"]["hearth"] = run_server(
                "hearth", lambda m: hearth_argv(folder, s, m), env, work, files, s.runs)
        if "llama-server" in wanted:
            if router and exe is not None:
                result["servers"]["llama-server"] = run_server(
                    "llama-server", lambda m: llama_argv(exe, folder, s, m), env, work, files, s.runs)
            else:
                result["servers"]["llama-server"] = {"skipped": router_note}
    finally:
        result["load_avg_end"] = load()
        shutil.rmtree(work, ignore_errors=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    s.out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    (s.out_dir / f"models-switch-{stamp}.json").write_text(text)
    (s.out_dir / "latest-models-switch.json").write_text(text)
    plot(result, s.out_dir / "latest-models-switch.png")
    for name, r in result["servers"].items():
        if "ttft_cold_s" in r:
            log(f"{name}: TTFT cold {r['ttft_cold_s']['median']} s, page-cached {r['ttft_cached_s']['median']} s, "
                f"loaded {r['ttft_loaded_s']['median']} s, switch {r.get('switch_s', {}).get('median')} s, "
                f"RSS {r['rss_mib']}")
        else:
            log(f"{name}: {r}")


if __name__ == "__main__":
    main()
