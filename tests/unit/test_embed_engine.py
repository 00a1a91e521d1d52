"""The embedding engine's packing (hearth.engine.embed) over the deterministic fake runner, and
the parsing of OpenAI's `input` shapes (hearth.api.embeddings)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hearth.api.embeddings import encode_base64, parse_input
from hearth.engine.embed import EmbedEngine, normalize
from hearth.engine.fake_embed import FakeEmbedRunner
from hearth.errors import BadRequest


def engine(**kw: int) -> tuple[EmbedEngine, FakeEmbedRunner]:
    runner = FakeEmbedRunner(**kw)
    e = EmbedEngine(runner)
    e.start()
    return e, runner


def test_vectors_come_back_in_order_and_match_one_at_a_time() -> None:
    e, runner = engine(n_batch=64, n_seq_max=8)
    try:
        seqs = [[1, i, i + 1, 2] for i in range(3, 40)]
        together = e.submit(seqs).future.result(timeout=30)
        alone = [e.submit([s]).future.result(timeout=30)[0] for s in seqs]
        for a, b, s in zip(together, alone, seqs, strict=True):
            assert np.array_equal(a, b)
            assert np.allclose(a, np.mean([runner.token_vector(t) for t in s], axis=0))
    finally:
        e.stop()


def test_calls_respect_the_token_and_sequence_caps_and_share_requests() -> None:
    e, runner = engine(n_batch=20, n_seq_max=4)
    runner.gate = threading.Event()
    try:
        first = e.submit([[1, 2]])  # held in its call by the gate while the others queue
        assert runner.entered.wait(30)
        jobs = [e.submit([[5] * 6, [6] * 6]) for _ in range(3)]
        runner.gate.set()
        for j in [first, *jobs]:
            j.future.result(timeout=30)
        for call in runner.calls:
            assert sum(call) <= 20 and len(call) <= 4
        # after the first call, the three queued requests' six sequences went in two calls of 3, not six
        assert runner.calls[1:] == [[6, 6, 6], [6, 6, 6]]
    finally:
        e.stop()


def test_a_cancelled_job_is_dropped_before_its_call() -> None:
    e, runner = engine()
    runner.gate = threading.Event()
    try:
        first = e.submit([[1, 2, 3]])
        assert runner.entered.wait(30)
        dropped = e.submit([[4, 4, 4, 4, 4]])
        dropped.cancelled.set()
        runner.gate.set()
        first.future.result(timeout=30)
        e.submit([[7]]).future.result(timeout=30)  # a later call: the cancelled one is gone by then
        assert dropped.future.cancelled()
        assert [5] not in runner.calls and all(5 not in c for c in runner.calls)
    finally:
        e.stop()


def test_too_long_or_empty_sequences_are_refused_at_submit() -> None:
    e, _ = engine(n_batch=8)
    try:
        with pytest.raises(ValueError):
            e.submit([[1] * 9])
        with pytest.raises(ValueError):
            e.submit([[]])
    finally:
        e.stop()


def test_normalize() -> None:
    v = normalize(np.array([3.0, 4.0], dtype=np.float32))
    assert np.allclose(v, [0.6, 0.8])
    assert np.array_equal(normalize(np.zeros(3, dtype=np.float32)), np.zeros(3))


@pytest.mark.parametrize(("value", "want"), [
    ("hi", ["hi"]),
    (["a", "b"], ["a", "b"]),
    ([1, 2, 3], [[1, 2, 3]]),
    ([[1, 2], [3]], [[1, 2], [3]]),
])
def test_parse_input_shapes(value: object, want: object) -> None:
    assert parse_input(value) == want


@pytest.mark.parametrize("value", [[], None, 3, ["a", 1], [[1], []], [[1], "a"], [True, 2], {"a": 1}, ["x"] * 2049])
def test_parse_input_refuses(value: object) -> None:
    with pytest.raises(BadRequest):
        parse_input(value)


def test_base64_is_little_endian_float32() -> None:
    import base64

    raw = base64.b64decode(encode_base64([1.0, -0.5]))
    assert np.array_equal(np.frombuffer(raw, dtype="<f4"), [1.0, -0.5])
