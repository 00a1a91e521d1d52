"""A model made ready at load (issue 38: the first answer after a restart): the warm-up runs the
template, the tokenizer and a sampler before the first request and touches no KV; the start
prefetch reads the recent prompts' blocks into RAM within its bounds."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hearth.backends.base import ModelCard
from hearth.backends.local.model import EngineSettings, LocalModel, load_model, model_folder, unload_model
from hearth.backends.local.warmup import ready_model, warm_up
from hearth.chat.template import ChatTemplate
from hearth.engine.prefix_cache import PrefixCache
from hearth.engine.types import SamplingParams
from hearth.models import ModelSpec
from tests.fakes import SMOL, ScriptedRunner

SPEC = ModelSpec("fake", Path("no-such-weights.gguf"))  # no file: the cache identity is the runner's alone


def loaded(settings: EngineSettings) -> tuple[LocalModel, ScriptedRunner]:
    runner = ScriptedRunner(n_seq_max=2, n_batch=64)

    def factory(spec: ModelSpec, s: EngineSettings) -> Any:
        return runner, ModelCard(spec.id, 0, meta={"n_ctx": 2048, "parallel": 2}), ChatTemplate(SMOL)

    return load_model(SPEC, settings, factory), runner


@pytest.fixture
def model() -> Iterator[tuple[LocalModel, ScriptedRunner]]:
    m, runner = loaded(EngineSettings(parallel=2, batch=64))
    yield m, runner
    unload_model(m)


def test_warm_up_renders_tokenizes_and_builds_a_sampler_and_leaves_no_kv(
        model: tuple[LocalModel, ScriptedRunner], monkeypatch: pytest.MonkeyPatch) -> None:
    m, runner = model
    calls: list[tuple[str, str]] = []
    render, tokenize, new_sampler = ChatTemplate.render, runner.tokenize, runner.new_sampler

    def spy_render(self: ChatTemplate, *a: Any, **kw: Any) -> str:
        calls.append(("render", threading.current_thread().name))
        return render(self, *a, **kw)

    def spy_tokenize(*a: Any, **kw: Any) -> list[int]:
        calls.append(("tokenize", threading.current_thread().name))
        return tokenize(*a, **kw)

    def spy_sampler(params: SamplingParams) -> Any:
        calls.append(("sampler", threading.current_thread().name))
        return new_sampler(params)

    monkeypatch.setattr(ChatTemplate, "render", spy_render)
    monkeypatch.setattr(runner, "tokenize", spy_tokenize)
    monkeypatch.setattr(runner, "new_sampler", spy_sampler)
    took = warm_up(m)
    assert set(took) == {"prepare", "sampler"}  # the fake runner has no llguidance tokenizer
    names = [c[0] for c in calls]
    assert "render" in names and "tokenize" in names
    assert [t for n, t in calls if n == "sampler"] == [f"engine-{m.spec.id}"]  # samplers live on the engine thread
    assert all(not seq for seq in runner.kv.values())  # nothing decoded, no KV written
    assert all(not s.tokens for s in m.engine.slots.slots)
    assert m.engine.cache is not None and m.engine.cache.stats().misses == 0


def test_a_failing_warm_up_step_is_logged_and_does_not_fail_the_load(
        model: tuple[LocalModel, ScriptedRunner], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    m, _ = model

    def broken(self: ChatTemplate, *a: Any, **kw: Any) -> str:
        raise RuntimeError("template exploded")

    monkeypatch.setattr(ChatTemplate, "render", broken)
    with caplog.at_level(logging.WARNING, logger="hearth.backend"):
        assert ready_model(m, EngineSettings()) is m
    assert "template exploded" in caplog.text


def state(tokens: list[int]) -> bytes:
    return b"FAKE" + np.asarray(tokens, dtype="<i4").tobytes()


@pytest.mark.parametrize("count", [0, 1, 2])
def test_ready_model_reads_the_most_recent_prompts_into_ram(tmp_path: Path, count: int) -> None:
    runner = ScriptedRunner(n_seq_max=2, n_batch=64)
    old, new = [1, *range(1000, 1300)], [1, *range(2000, 2300)]  # a full block and a partial one each
    first = PrefixCache(runner, {**runner.fingerprint, "weights": None}, directory=tmp_path / model_folder(SPEC),
                        ram_budget=1 << 20, disk_budget=1 << 20)
    for p in (old, new):
        first.offer(p, lambda p=p: state(p))  # type: ignore[misc]
        assert first.flush()
    first.close()
    m, _ = loaded(EngineSettings(parallel=2, batch=64, cache_dir=tmp_path, prompt_cache_prefetch=count))
    try:
        assert m.engine.cache is not None
        assert m.engine.cache.match(new) is None and m.engine.cache.match(old) is None  # a load alone reads none
        ready_model(m, EngineSettings(prompt_cache_prefetch=count))
        got = {name: (mt := m.engine.cache.match(p)) is not None and mt.n_tokens == len(p)
               for name, p in (("old", old), ("new", new))}
        # The writer may write one prompt's files within the same second as the other's: the
        # newer is the one written last unless their mtimes tie, so count, not order, is asserted
        # where both could rank first.
        assert sum(got.values()) == count
        assert m.engine.cache.stats().loaded_bytes == count * 4 * len(new)
        # The prompts read are laid into the idle slots too, each slot's KV exactly its tokens.
        filled = [s for s in m.engine.slots.slots if s.tokens]
        assert len(filled) == count
        for slot in filled:
            assert slot.tokens in (old, new) and runner_of(m).kv[slot.seq_id] == slot.tokens and slot.ns == ""
    finally:
        unload_model(m)


def runner_of(m: LocalModel) -> ScriptedRunner:
    assert isinstance(m.runner, ScriptedRunner)
    return m.runner


def write_prompts(tmp_path: Path, prompts: list[list[int]], ns: str = "") -> None:
    runner = ScriptedRunner(n_seq_max=2, n_batch=64)
    first = PrefixCache(runner, {**runner.fingerprint, "weights": None}, directory=tmp_path / model_folder(SPEC),
                        ram_budget=1 << 20, disk_budget=1 << 20)
    for p in prompts:
        first.offer(p, lambda p=p: state(p), ns=ns)  # type: ignore[misc]
        assert first.flush()
    first.close()


def test_a_corrupt_block_is_neither_prefetched_nor_laid_into_a_slot(tmp_path: Path) -> None:
    p = [1, *range(1000, 1300)]
    write_prompts(tmp_path, [p])
    files = sorted((tmp_path / model_folder(SPEC)).glob("*.kvb"), key=lambda f: f.stat().st_size)
    raw = bytearray(files[-1].read_bytes())  # the full first block (the larger file)
    raw[-1] ^= 0xFF  # its payload: found only when read
    files[-1].write_bytes(bytes(raw))
    settings = EngineSettings(parallel=2, batch=64, cache_dir=tmp_path)
    m, runner = loaded(settings)
    try:
        ready_model(m, settings)
        assert m.engine.cache is not None
        assert m.engine.cache.match(p) is None and m.engine.cache.stats().rejected_files == 1
        assert all(not s.tokens for s in m.engine.slots.slots)
        assert all(not kv for kv in runner.kv.values())
    finally:
        unload_model(m)


def test_another_namespaces_prompt_is_prefetched_but_not_laid_into_a_slot(tmp_path: Path) -> None:
    p = [1, *range(1000, 1300)]
    write_prompts(tmp_path, [p], ns="tenant-a")
    settings = EngineSettings(parallel=2, batch=64, cache_dir=tmp_path)
    m, _ = loaded(settings)
    try:
        ready_model(m, settings)
        assert m.engine.cache is not None
        got = m.engine.cache.match(p, "tenant-a")
        assert got is not None and got.n_tokens == len(p)  # in RAM for its namespace's next request
        assert all(not s.tokens for s in m.engine.slots.slots)  # a slot would not know its namespace
    finally:
        unload_model(m)


def test_the_start_prefetch_never_reads_past_its_byte_bound(tmp_path: Path) -> None:
    runner = ScriptedRunner(n_seq_max=2, n_batch=64)
    p = [1, *range(1000, 1300)]
    first = PrefixCache(runner, {**runner.fingerprint, "weights": None}, directory=tmp_path / model_folder(SPEC),
                        ram_budget=1 << 20, disk_budget=1 << 20)
    first.offer(p, lambda: state(p))
    assert first.flush()
    first.close()
    settings = EngineSettings(parallel=2, batch=64, cache_dir=tmp_path, prompt_cache_prefetch=4,
                              prompt_cache_prefetch_mb=0)
    m, _ = loaded(settings)
    try:
        ready_model(m, settings)
        assert m.engine.cache is not None and m.engine.cache.stats().loaded_bytes == 0
    finally:
        unload_model(m)
