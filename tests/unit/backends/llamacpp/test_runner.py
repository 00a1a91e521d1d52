"""The real runner's identity: what saved KV depends on, read from the llama.cpp context."""

from __future__ import annotations

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
