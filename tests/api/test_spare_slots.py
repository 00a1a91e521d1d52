"""Spare slots (backends/local/admission.py, "Spare slots"; `--spare-slots`): a request of a
class above running work starts at once in a KV slot beyond --parallel, beside that work,
instead of pausing it; lower-class work never takes that slot.

Why these cannot flake: the flex request sits inside the engine (the scripted runner's gate
holds its decode) until the admission queue itself says what was let through; what ran is
then read from the engine's own counters (pauses) and the answers, not from timing."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from hearth.backends.base import ModelCard
from hearth.backends.local.backend import LocalBackend
from hearth.backends.local.model import EngineSettings
from hearth.chat.template import ChatTemplate
from hearth.models import ModelSpec
from tests.api.conftest import Harness, serve
from tests.fakes import SMOL, ScriptedRunner
from tests.helpers import until


def backend(tmp_path: Path, spare: int) -> tuple[LocalBackend, ScriptedRunner]:
    """One slot (--parallel 1) and `spare` spare slots: the runner has both."""
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    runner = ScriptedRunner(n_seq_max=1 + spare, n_batch=64)
    runner.answer = b"ok"

    def factory(spec: ModelSpec, settings: EngineSettings) -> Any:
        return runner, ModelCard(spec.id, 0, meta={"n_ctx": 2048, "parallel": 1}), ChatTemplate(SMOL)

    settings = EngineSettings(parallel=1, spare_slots=spare, batch=64)
    return LocalBackend([ModelSpec("fake", weights)], settings, factory), runner


def chat(marker: str, **extra: Any) -> dict[str, Any]:
    return {"model": "fake", "max_tokens": 3, "messages": [{"role": "user", "content": marker}], **extra}


async def run_beside_flex(h: Harness, runner: ScriptedRunner) -> tuple[list[int], int, bool]:
    """A flex request holds the one slot inside the engine; a second flex one, then a default
    one arrive; the default one is let through (the second flex one still waits) before the
    engine goes on. Returns the three statuses, the engine's pauses, and whether a slot still
    holds the default request's prompt once all three are done (warm for its next turn)."""
    model = h.backend.model("fake")  # type: ignore[attr-defined]
    admission, engine = model.admission, model.engine
    runner.gate = gate = threading.Event()
    held = asyncio.create_task(h.post("/v1/chat/completions", chat("held", service_tier="flex")))
    assert await asyncio.to_thread(runner.entered.wait, 10)
    flex = asyncio.create_task(h.post("/v1/chat/completions", chat("second", service_tier="flex")))
    await until(lambda: admission.waiting == 1, "the second flex request queued")
    default = asyncio.create_task(h.post("/v1/chat/completions", chat("interactive")))
    await until(lambda: admission.in_use == 2, "the default request let through")
    assert admission.waiting == 1  # the second flex request still waits
    runner.gate = None
    gate.set()
    answers = await asyncio.gather(held, flex, default)
    warm = any(b"interactive" in bytes(t for t in s.tokens if t < 256) for s in engine.slots.slots)
    return [r.status_code for r in answers], int(engine.preempt.pauses), warm


async def test_a_default_request_runs_in_the_spare_slot_beside_flex_work_without_a_pause(tmp_path: Path) -> None:
    b, runner = backend(tmp_path, spare=1)
    async with serve(tmp_path, backend=b, runner=runner, parallel=1) as h:
        statuses, pauses, warm = await run_beside_flex(h, runner)
    assert statuses == [200, 200, 200]
    assert pauses == 0  # it ran beside the flex request: nothing paused
    assert warm  # the second flex request took the first one's slot, not the spare one


async def test_without_a_spare_slot_the_flex_request_is_paused_instead(tmp_path: Path) -> None:
    b, runner = backend(tmp_path, spare=0)
    async with serve(tmp_path, backend=b, runner=runner, parallel=1, spare_slots=0) as h:
        statuses, pauses, warm = await run_beside_flex(h, runner)
    assert statuses == [200, 200, 200]
    assert pauses == 1 and not warm
