"""The model runner over llama-cpp-python's low-level (ctypes) API.

One context with `n_seq_max` sequences and `n_seq_max * seq_ctx` KV cells, so every sequence
can grow to `seq_ctx` tokens without ever running out of cells (one stream of `seq_ctx` cells
per sequence by default; one shared buffer with kv_unified).
The batch is our own `llama_batch` whose arrays are numpy buffers, so filling it is a few
vectorised copies per step instead of a Python loop per token.

Used only from the engine thread (a llama.cpp context is not thread-safe); `tokenize` and
`token_bytes` only read the vocabulary and are safe from any thread. Its samplers are
`sampler.NativeSampler`; the byte layout of saved sequence state is `seq_state`.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np
from llama_cpp import _logger as llama_logger

from hearth.backends.llamacpp import native, seq_state
from hearth.backends.llamacpp.abort_flag import AbortFlag, callback_address
from hearth.backends.llamacpp.gap_fill import gap_fills
from hearth.backends.llamacpp.sampler import CompiledGrammar, NativeSampler
from hearth.backends.llamacpp.token_mask import MaskCompiler
from hearth.engine.grammar_cache import GrammarCache, GrammarCacheStats
from hearth.engine.runner import BatchEntry, DecodeAborted
from hearth.engine.types import SamplingParams

log = logging.getLogger("hearth.llamacpp")

# ggml_type value → its name ("f16", "q8_0", ...), from the bindings' GGML_TYPE_* constants.
GGML_TYPE_NAMES: dict[int, str] = {int(getattr(L, n)): n.removeprefix("GGML_TYPE_").lower()
                                   for n in dir(L) if n.startswith("GGML_TYPE_") and n != "GGML_TYPE_COUNT"}

# Token attributes llama.cpp's tokenizer matches in text before anything else (`cuts_text`).
_PARTITIONED = L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_USER_DEFINED | L.LLAMA_TOKEN_ATTR_UNKNOWN

_backend_lock = threading.Lock()
_backend_ready = False

# KV cache element types (`--kv-type`), as llama.cpp's ggml_type ids. A quantized V cache needs
# flash attention, which llama.cpp's "auto" setting then turns on.
KV_TYPES: dict[str, int] = {"f16": L.GGML_TYPE_F16, "q8_0": L.GGML_TYPE_Q8_0, "q4_0": L.GGML_TYPE_Q4_0}


def _init_backend(verbose: bool) -> None:
    global _backend_ready
    with _backend_lock:
        llama_logger.set_verbose(verbose)
        if not _backend_ready:
            L.llama_backend_init()
            _backend_ready = True


@dataclass(frozen=True, slots=True)
class ModelInfo:
    path: str
    description: str
    n_params: int
    size_bytes: int
    n_ctx_train: int
    n_vocab: int
    chat_template: str | None
    bos_token: str
    eos_token: str
    architecture: str


class LlamaCppRunner:
    def __init__(self, model_path: str | Path, *, seq_ctx: int | None = None, n_seq_max: int = 4,
                 n_batch: int = 512, n_threads: int | None = None, kv_unified: bool = False,
                 kv_type: str = "f16", verbose: bool = False) -> None:
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {', '.join(KV_TYPES)}")
        _init_backend(verbose)
        self.path = str(model_path)
        if not Path(self.path).is_file():
            raise FileNotFoundError(f"model file not found: {self.path}")
        model = native.load_model(self.path)
        self.model = model
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(L.llama_model_n_ctx_train(model))
        self.seq_ctx = min(seq_ctx or self.n_ctx_train, self.n_ctx_train)
        self.n_seq_max = n_seq_max
        self.n_batch = max(n_batch, n_seq_max)

        cparams = L.llama_context_default_params()
        cparams.n_ctx = self.seq_ctx * n_seq_max
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = n_seq_max
        threads = n_threads or max(1, (__import__("os").cpu_count() or 1))
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.kv_unified = kv_unified
        cparams.type_k = cparams.type_v = KV_TYPES[kv_type]
        cparams.no_perf = True
        # interrupt(): a C callback polls this flag between graph nodes (see abort_flag.py).
        self._abort = AbortFlag()
        address = callback_address()
        self.can_interrupt = address is not None
        if address is not None:
            self._abort_cb = L.ggml_abort_callback(address)  # kept alive as long as the context
            cparams.abort_callback = self._abort_cb
            cparams.abort_callback_data = self._abort.address
        ctx = L.llama_init_from_model(model, cparams)
        if not ctx:
            L.llama_model_free(model)
            raise RuntimeError("llama.cpp could not create a context (out of memory?)")
        self.ctx = ctx
        self.mem = L.llama_get_memory(ctx)
        # The KV cache's element types, as the context was built with them (llama.cpp has no
        # getter); saved KV only loads into a cache of the same types.
        self.kv_type = _kv_type_name(int(cparams.type_k), int(cparams.type_v))
        self.n_threads = threads
        self.kv_unified = kv_unified

        self._eog = np.array([bool(L.llama_vocab_is_eog(self.vocab, t)) for t in range(self.n_vocab)])
        self.eog_tokens = [int(t) for t in np.flatnonzero(self._eog)]
        self._pieces: dict[int, bytes] = {}
        self._swa = int(L.llama_model_n_swa(model)) > 0
        self._fill_token = int(self._eog.argmax())  # any valid id: its cell is removed after the call
        self._alloc_batch(self.n_batch)
        self.info = self._read_info()
        self._state_header: int | None = None
        self._state_header_len()  # measured now, while every sequence is empty
        self._kv_layout: seq_state.KVLayout | None = None  # probed on first use (`_layout`)
        # Grammars parsed against this model's vocabulary, once per text (samplers take clones).
        self.grammars: GrammarCache[CompiledGrammar] = GrammarCache(
            self._compile_grammar, CompiledGrammar.clone, CompiledGrammar.free)
        self.masks = MaskCompiler(self.vocab, self.n_vocab, self.eog_tokens)

    # ---- vocabulary ---------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return native.tokenize(self.vocab, text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._render(token, special=False)
            self._pieces[token] = piece
        return piece

    def token_text(self, token: int) -> bytes:
        """The token as written in a prompt (special tokens included)."""
        return self._render(token, special=True)

    def cuts_text(self, token: int) -> bool:
        # llama.cpp's tokenizer first cuts the text at every control, user-defined or unknown
        # token spelled in it (tokenizer_st_partition), then tokenizes each piece alone.
        return bool(L.llama_vocab_get_attr(self.vocab, token) & _PARTITIONED)

    def _render(self, token: int, *, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token])

    # ---- decoding -------------------------------------------------------------------

    def _alloc_batch(self, cap: int) -> None:
        self._tok = np.zeros(cap, dtype=np.int32)
        self._pos = np.zeros(cap, dtype=np.int32)
        self._nseq = np.ones(cap, dtype=np.int32)
        self._seq = np.zeros(cap, dtype=np.int32)
        self._out = np.zeros(cap, dtype=np.int8)
        # seq_id is an array of pointers, one per token, each to that token's one seq id
        base = self._seq.ctypes.data
        self._seq_ptrs = (ctypes.POINTER(L.llama_seq_id) * cap)(
            *[ctypes.cast(base + 4 * i, ctypes.POINTER(L.llama_seq_id)) for i in range(cap)])
        # Any: llama-cpp-python declares these pointer fields as arrays; they take pointers.
        batch: Any = L.llama_batch()
        batch.token = self._tok.ctypes.data_as(ctypes.POINTER(L.llama_token))
        batch.embd = ctypes.POINTER(ctypes.c_float)()
        batch.pos = self._pos.ctypes.data_as(ctypes.POINTER(L.llama_pos))
        batch.n_seq_id = self._nseq.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = self._seq_ptrs
        batch.logits = self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self._batch = batch

    def decode(self, entries: list[BatchEntry]) -> list[int]:
        # With one KV stream per sequence, llama.cpp cuts a batch into ubatches that each take
        # the same number of tokens from a run of consecutive sequence ids, in batch order
        # (llama_batch_allocr::split_equal), and computes the whole graph once per ubatch. Laid
        # out by sequence id, the decode tokens of all running sequences share one ubatch;
        # in arrival order they could take several (one graph pass each).
        # Idle sequences between running ones get a throwaway token (gap_fill.py), -1 here.
        fills = [] if self.kv_unified or self._swa else gap_fills(
            entries, self._next_pos, n_batch=self.n_batch, seq_ctx=self.seq_ctx)
        laid = sorted([*((e.seq_id, i, e) for i, e in enumerate(entries)),
                       *((sid, -1, BatchEntry(sid, [self._fill_token], pos, 0)) for sid, pos in fills)],
                      key=lambda x: x[0])
        first_row = [0] * len(entries)
        n = 0
        for _, i, e in laid:
            k = len(e.tokens)
            if n + k > self.n_batch:
                raise RuntimeError(f"batch of {n + k} tokens exceeds n_batch {self.n_batch}")
            self._tok[n:n + k] = e.tokens
            self._pos[n:n + k] = np.arange(e.pos0, e.pos0 + k, dtype=np.int32)
            self._seq[n:n + k] = e.seq_id
            self._out[n:n + k] = 0
            if e.n_logits:
                self._out[n + k - e.n_logits:n + k] = 1
                first_row[i] = n + k - e.n_logits
            n += k
        self._batch.n_tokens = n
        try:
            rc = L.llama_decode(self.ctx, self._batch)
        finally:
            for sid, pos in fills:  # the fill token's cell goes at once: the sequence is as before
                L.llama_memory_seq_rm(self.mem, sid, pos, -1)
        if rc == 2:
            # llama.cpp removed the aborted ubatch's positions; earlier ubatches stay written.
            # Drop those too, so every sequence is exactly as before this call.
            for e in entries:
                L.llama_memory_seq_rm(self.mem, e.seq_id, e.pos0, -1)
            raise DecodeAborted("llama_decode was interrupted")
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return [first_row[i] for i, e in enumerate(entries) if e.n_logits]

    def _next_pos(self, seq_id: int) -> int:
        return int(L.llama_memory_seq_pos_max(self.mem, seq_id)) + 1

    def interrupt(self) -> None:
        self._abort.set()

    def clear_interrupt(self) -> None:
        self._abort.clear()

    def logits(self, logits_index: int) -> np.ndarray:
        ptr = L.llama_get_logits_ith(self.ctx, logits_index)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def new_sampler(self, params: SamplingParams) -> NativeSampler:
        return NativeSampler(self, params)

    def check_grammar(self, grammar: str) -> None:
        """Raise ValueError if llama.cpp cannot parse `grammar` (GBNF with a `root` rule); else
        it is compiled and cached for the request's sampler. Reads only the vocabulary, so it is
        safe outside the engine thread (where llguidance's tokenizer is built, once)."""
        self.masks.prepare()
        self.grammars.compile(grammar)

    def grammar_stats(self) -> GrammarCacheStats:
        return self.grammars.stats()

    def _compile_grammar(self, grammar: str) -> CompiledGrammar:
        smpl = L.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if not smpl:
            raise ValueError("the grammar is not valid GBNF (llama.cpp could not parse it)")
        return CompiledGrammar(smpl, self.masks.matcher(grammar))

    def kv_remove(self, seq_id: int, p0: int, p1: int) -> None:
        if not L.llama_memory_seq_rm(self.mem, seq_id, p0, p1):
            raise RuntimeError(f"could not remove positions [{p0}, {p1}) of sequence {seq_id}")

    def kv_copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        L.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def _state_bytes(self, seq_id: int) -> bytes:
        size = L.llama_state_seq_get_size(self.ctx, seq_id)
        buf = (ctypes.c_uint8 * size)()
        n = L.llama_state_seq_get_data(self.ctx, buf, size, seq_id)
        if n != size:
            raise RuntimeError(f"could not read the state of sequence {seq_id} ({n} of {size} bytes)")
        return bytes(buf)

    def _state_header_len(self) -> int:
        """Measured once, on the state of an empty sequence (see `seq_state.header_len`)."""
        if self._state_header is None:
            free = next((s for s in range(self.n_seq_max)
                         if L.llama_memory_seq_pos_max(self.mem, s) < 0), None)
            if free is None:
                raise RuntimeError("no empty sequence to measure the state header on")
            n_stream = 1 if self.kv_unified else self.n_seq_max
            self._state_header = seq_state.header_len(self._state_bytes(free), n_stream)
        return self._state_header

    def state_get(self, seq_id: int) -> bytes:
        """The KV state of one sequence, in a form that does not depend on --parallel: one
        stream, whatever the number of slots (hearth.backends.llamacpp.seq_state)."""
        h = self._state_header_len()
        data = self._state_bytes(seq_id)
        return data if self.kv_unified else seq_state.single_stream(data, h, seq_id, self.n_seq_max)

    def state_set(self, seq_id: int, data: bytes) -> None:
        """Replace the KV of `seq_id` with `state_get` bytes; ValueError if llama.cpp rejects
        them (another model, KV type or layout), in which case the sequence is left empty."""
        h = self._state_header_len()
        seq_state.check_single_stream(data, h)
        # One copy into a writable buffer llama.cpp reads in place (ctypes wants a writable one).
        self._load_state(seq_id, seq_state.as_streams(data, h, self.n_seq_max) if not self.kv_unified
                         else bytearray(data))

    def state_set_blocks(self, seq_id: int, parts: Sequence[tuple[bytes | bytearray, int, int]]) -> None:
        """`state_set(seq_id, kv_join(parts))` with one copy of the KV: the blocks are laid
        straight into the buffer llama.cpp reads (seq_state.join_blocks with the streams)."""
        n_stream = 1 if self.kv_unified else self.n_seq_max
        self._load_state(seq_id, seq_state.join_blocks(self._layout(), parts, n_stream))

    def _load_state(self, seq_id: int, own: bytearray) -> None:
        L.llama_memory_seq_rm(self.mem, seq_id, -1, -1)
        buf = (ctypes.c_uint8 * len(own)).from_buffer(own)
        if L.llama_state_seq_set_data(self.ctx, buf, len(own), seq_id) == 0:
            L.llama_memory_seq_rm(self.mem, seq_id, -1, -1)
            raise ValueError("llama.cpp rejected the saved KV state (different model or KV layout)")

    def _layout(self) -> seq_state.KVLayout:
        """The block layout of this context's sequence states, read off a two-token state
        decoded into sequence 0 and removed again, the first time it is needed. That decode
        must run on the engine thread (the loader calls `kv_block_bytes` through `Engine.call`
        before the engine takes requests): a decode from any other thread once left every
        later decode of the server a third slower (measured: 115 against 170 tokens/s)."""
        if self._kv_layout is None:
            self._kv_layout = self._probe_kv_layout()
        return self._kv_layout

    def _probe_kv_layout(self) -> seq_state.KVLayout:
        bos = int(L.llama_vocab_bos(self.vocab))
        token = bos if 0 <= bos < self.n_vocab else 0
        try:
            self.decode([BatchEntry(0, [token, token], 0, 0)])
            return seq_state.layout_of(self.state_get(0), self._state_header_len())
        finally:
            L.llama_memory_seq_rm(self.mem, 0, -1, -1)

    def kv_split(self, data: bytes, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Block payloads of `state_get` bytes for position ranges (hearth.backends.llamacpp.
        seq_state); pure, safe from any thread."""
        return seq_state.split_blocks(data, self._state_header_len(), self._layout(), ranges)

    def kv_join(self, parts: Sequence[tuple[bytes | bytearray, int, int]]) -> bytes:
        # Imports' path only (kv_checked): the prompt cache restores by state_set_blocks.
        return bytes(seq_state.join_blocks(self._layout(), parts))

    def kv_block_bytes(self, n_tokens: int) -> int:
        return n_tokens * self._layout().per_token

    def kv_checked(self, tokens: list[int], data: bytes) -> bytes:
        """Engine thread (the layout). See `Runner.kv_checked`."""
        bad = next((t for t in tokens if not 0 <= t < self.n_vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is out of range [0, {self.n_vocab})")
        n = seq_state.cells_of(data, self._state_header_len(), self._layout())
        if n < len(tokens):
            raise ValueError(f"the saved KV holds {n} cells for {len(tokens)} tokens")
        if n == len(tokens):
            return data
        return self.kv_join([(self.kv_split(data, [(0, len(tokens))])[0], len(tokens), len(tokens))])

    def state_bytes_bound(self, n_tokens: int) -> int:
        """At most how many bytes `state_get` returns for a sequence of `n_tokens`: per cell its
        position and sequence id, per layer an f16 K and V row of n_head_kv heads; a quarter and
        16 MiB of headroom cover layer headers and architectures whose layout differs (used to
        refuse imported KV that no sequence of this model could hold)."""
        arch = self.info.architecture
        n_head = max(1, int(L.llama_model_n_head(self.model)))
        n_head_kv = max(1, int(L.llama_model_n_head_kv(self.model)))
        n_embd = int(L.llama_model_n_embd(self.model))
        k_len = int(self.meta(f"{arch}.attention.key_length") or n_embd // n_head)
        v_len = int(self.meta(f"{arch}.attention.value_length") or k_len)
        per_token = int(L.llama_model_n_layer(self.model)) * n_head_kv * (k_len + v_len) * 2 + 12
        return per_token * n_tokens * 5 // 4 + (16 << 20)

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What saved KV state depends on: restoring needs the same model file and KV layout."""
        return {"model_size": self.info.size_bytes, "n_params": self.info.n_params,
                "arch": self.info.architecture, "n_vocab": self.n_vocab, "kv_unified": self.kv_unified,
                "llama_cpp_python": L.__version__, "kv_type": self.kv_type}

    # ---- metadata ---------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        return native.model_meta(self.model, key)

    def _read_info(self) -> ModelInfo:
        desc = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.model, desc, len(desc))
        bos = L.llama_vocab_bos(self.vocab)
        eos = L.llama_vocab_eos(self.vocab)
        return ModelInfo(
            path=self.path,
            description=desc.value.decode(errors="replace"),
            n_params=int(L.llama_model_n_params(self.model)),
            size_bytes=int(L.llama_model_size(self.model)),
            n_ctx_train=self.n_ctx_train,
            n_vocab=self.n_vocab,
            chat_template=self.meta("tokenizer.chat_template"),
            bos_token=self.token_text(bos).decode(errors="replace") if bos >= 0 else "",
            eos_token=self.token_text(eos).decode(errors="replace") if eos >= 0 else "",
            architecture=self.meta("general.architecture") or "unknown",
        )

    def close(self) -> None:
        if getattr(self, "grammars", None):
            self.grammars.clear()
        if getattr(self, "ctx", None):
            L.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            L.llama_model_free(self.model)
            self.model = None


def _kv_type_name(type_k: int, type_v: int) -> str:
    """"f16", or "q8_0/f16" when K and V differ."""
    k, v = (GGML_TYPE_NAMES.get(t, f"ggml_type_{t}") for t in (type_k, type_v))
    return k if k == v else f"{k}/{v}"
