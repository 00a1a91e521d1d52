"""The real runner's identity: what saved KV depends on, read from the llama.cpp context."""

from __future__ import annotations

import pytest

from hearth.backends.llamacpp.gap_fill import gap_fills
from hearth.backends.llamacpp.runner import LlamaCppRunner, _kv_type_name
from hearth.models import embedded_model_path


def test_kv_type_names() -> None:
    assert _kv_type_name(1, 1) == "f16"
    assert _kv_type_name(8, 8) == "q8_0"
    assert _kv_type_name(8, 1) == "q8_0/f16"


def test_the_fingerprint_carries_the_contexts_kv_type() -> None:
    runner = LlamaCppRunner(embedded_model_path(), seq_ctx=64, n_seq_max=1, n_batch=16, n_threads=1)
    try:
        fp = runner.fingerprint
        assert fp["kv_type"] == runner.kv_type == "f16"  # the default context's KV cache type
        assert fp["n_vocab"] == runner.n_vocab and fp["kv_unified"] is False
    finally:
        runner.close()


def test_a_gap_between_running_sequences_is_filled_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode tokens of sequences 0, 1, 2 and 4 (3 idle, holding a prompt): the runner gives 3 a
    throwaway token so llama.cpp runs one graph pass (gap_fill.py), and removes it: the logits
    are bit for bit those of the call without it, and sequence 3's KV is unchanged."""
    import numpy as np

    from hearth.backends.llamacpp import runner as runner_module
    from hearth.engine.runner import BatchEntry

    runner = LlamaCppRunner(embedded_model_path(), seq_ctx=128, n_seq_max=5, n_batch=64, n_threads=1)
    try:
        for s in range(5):
            runner.decode([BatchEntry(s, [100 + (i * 7 + s) % 900 for i in range(20 + s)], 0, 1)])
        idle = runner._state_bytes(3)

        def step(fill: bool) -> list[np.ndarray]:
            entries = [BatchEntry(s, [500 + s], 20 + s, 1) for s in (0, 1, 2, 4)]
            assert gap_fills(entries, runner._next_pos, n_batch=runner.n_batch, seq_ctx=runner.seq_ctx) == [(3, 23)]
            with monkeypatch.context() as m:
                if not fill:
                    m.setattr(runner_module, "gap_fills", lambda *a, **k: [])
                rows = runner.decode(entries)
            out = [runner.logits(i).copy() for i in rows]
            for e in entries:
                runner.kv_remove(e.seq_id, e.pos0, -1)
            return out

        filled, split = step(True), step(False)
        assert all(np.array_equal(a, b) for a, b in zip(filled, split, strict=True))
        assert runner._state_bytes(3) == idle
    finally:
        runner.close()
