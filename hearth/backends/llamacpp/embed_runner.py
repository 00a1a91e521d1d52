"""An embedding model over llama-cpp-python's low-level API: a context created with
`embeddings = true` and the pooling type the GGUF declares (`<arch>.pooling_type`, which
llama.cpp reads when the context asks for LLAMA_POOLING_TYPE_UNSPECIFIED), and one pooled
vector per sequence read with `llama_get_embeddings_seq`.

One `embed` call is one `llama_decode` over whole sequences (an encoder such as BERT attends
over a sequence in one pass, so `n_ubatch` equals `n_batch` and bounds the tokens of a call).
A causal embedding model (last-token pooling, e.g. Qwen3-Embedding) has a KV cache: it is
cleared after every call, and one unified buffer of `n_batch` cells is all it needs.

Used only from the embedding engine's thread; `tokenize` only reads the vocabulary.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np

from hearth.backends.llamacpp import native
from hearth.backends.llamacpp.runner import _init_backend

POOLING_NAMES = {int(L.LLAMA_POOLING_TYPE_NONE): "none", int(L.LLAMA_POOLING_TYPE_MEAN): "mean",
                 int(L.LLAMA_POOLING_TYPE_CLS): "cls", int(L.LLAMA_POOLING_TYPE_LAST): "last",
                 int(L.LLAMA_POOLING_TYPE_RANK): "rank"}
MAX_SEQ = 256  # llama.cpp's LLAMA_MAX_SEQ


class LlamaCppEmbedRunner:
    def __init__(self, model_path: str | Path, *, seq_ctx: int | None = None, n_batch: int = 512,
                 n_seq_max: int = 64, n_threads: int | None = None, verbose: bool = False) -> None:
        _init_backend(verbose)
        self.path = str(model_path)
        if not Path(self.path).is_file():
            raise FileNotFoundError(f"model file not found: {self.path}")
        model = native.load_model(self.path)
        self.model = model
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(L.llama_model_n_ctx_train(model))
        self.n_embd = int(L.llama_model_n_embd(model))
        self.seq_ctx = min(seq_ctx or self.n_ctx_train, self.n_ctx_train)
        # a call holds at least one sequence of the longest allowed length
        self.n_batch = max(n_batch, self.seq_ctx)
        self.n_seq_max = max(1, min(n_seq_max, MAX_SEQ))
        cparams = L.llama_context_default_params()
        cparams.embeddings = True
        cparams.pooling_type = L.LLAMA_POOLING_TYPE_UNSPECIFIED  # the GGUF's own
        cparams.n_ctx = self.n_batch
        cparams.n_batch = cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = self.n_seq_max
        cparams.kv_unified = True  # a causal model's cache: one buffer, cleared after each call
        threads = n_threads or max(1, os.cpu_count() or 1)
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.no_perf = True
        ctx = L.llama_init_from_model(model, cparams)
        if not ctx:
            L.llama_model_free(model)
            raise RuntimeError("llama.cpp could not create an embedding context (out of memory?)")
        self.ctx = ctx
        self.mem = L.llama_get_memory(ctx)
        self.n_threads = threads
        self.pooling_type = int(L.llama_pooling_type(ctx))
        if self.pooling_type == int(L.LLAMA_POOLING_TYPE_NONE):
            L.llama_free(ctx)
            L.llama_model_free(model)
            raise ValueError(f"{self.path} declares no pooling (per-token embeddings): not a sentence "
                             "embedding model")
        self.pooling = POOLING_NAMES.get(self.pooling_type, str(self.pooling_type))
        self.architecture = self.meta("general.architecture") or "?"
        self.description = self.meta("general.name") or Path(self.path).stem
        self.n_params = int(L.llama_model_n_params(model))
        self.size_bytes = int(L.llama_model_size(model))
        self._alloc_batch(self.n_batch)

    def _alloc_batch(self, cap: int) -> None:
        self._tok = np.zeros(cap, dtype=np.int32)
        self._pos = np.zeros(cap, dtype=np.int32)
        self._seq = np.zeros(cap, dtype=np.int32)
        self._nseq = np.ones(cap, dtype=np.int32)
        self._out = np.ones(cap, dtype=np.int8)  # pooling reads every token's output
        base = self._seq.ctypes.data
        self._seq_ptrs = (ctypes.POINTER(L.llama_seq_id) * cap)(
            *[ctypes.cast(base + 4 * i, ctypes.POINTER(L.llama_seq_id)) for i in range(cap)])
        batch: Any = L.llama_batch()
        batch.token = self._tok.ctypes.data_as(ctypes.POINTER(L.llama_token))
        batch.embd = None
        batch.pos = self._pos.ctypes.data_as(ctypes.POINTER(L.llama_pos))
        batch.n_seq_id = self._nseq.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = self._seq_ptrs
        batch.logits = self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self._batch = batch

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """WordPiece (or the model's own) tokens. A special token spelled in `text` ("[SEP]") is
        that token, as sentence-transformers' tokenizer reads it (and llama-server's)."""
        return native.tokenize(self.vocab, text, add_special=add_special, parse_special=True)

    def embed(self, seqs: list[list[int]]) -> list[np.ndarray]:
        total = sum(len(s) for s in seqs)
        if total > self.n_batch or len(seqs) > self.n_seq_max or not all(seqs):
            raise ValueError(f"{len(seqs)} sequences of {total} tokens do not fit one call "
                             f"({self.n_seq_max} sequences, {self.n_batch} tokens)")
        n = 0
        for i, s in enumerate(seqs):
            k = len(s)
            self._tok[n:n + k] = s
            self._pos[n:n + k] = np.arange(k, dtype=np.int32)
            self._seq[n:n + k] = i
            n += k
        self._batch.n_tokens = n
        rc = L.llama_decode(self.ctx, self._batch)
        try:
            if rc != 0:
                raise RuntimeError(f"llama_decode failed ({rc}) on {len(seqs)} sequences of {total} tokens")
            out = []
            for i in range(len(seqs)):
                ptr = L.llama_get_embeddings_seq(self.ctx, i)
                if not ptr:
                    raise RuntimeError(f"llama.cpp returned no embedding for sequence {i}")
                out.append(np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy())
            return out
        finally:
            if self.mem:
                L.llama_memory_clear(self.mem, True)

    def meta(self, key: str) -> str | None:
        return native.model_meta(self.model, key)

    def close(self) -> None:
        if getattr(self, "ctx", None):
            L.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            L.llama_model_free(self.model)
            self.model = None
