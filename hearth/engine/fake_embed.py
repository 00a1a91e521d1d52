"""A deterministic embedding runner for tests: each token id stands for a fixed pseudo-random
vector, and a sequence's vector is their mean (mean pooling), so equal token lists give equal
vectors and the engine's packing can be checked without a model."""

from __future__ import annotations

import threading

import numpy as np


class FakeEmbedRunner:
    def __init__(self, n_embd: int = 16, n_batch: int = 64, n_seq_max: int = 8, seq_ctx: int = 32,
                 n_vocab: int = 1000) -> None:
        self.n_embd, self.n_batch, self.n_seq_max = n_embd, n_batch, n_seq_max
        self.seq_ctx = self.n_ctx_train = seq_ctx
        self.n_vocab = n_vocab
        self.calls: list[list[int]] = []  # the sequence lengths of every call, in order
        self.gate: threading.Event | None = None  # tests: each call waits for it to be set
        self.entered = threading.Event()  # set when a call starts
        self.closed = False

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """One token per word (a stable hash), between [CLS]=1 and [SEP]=2 as BERT's."""
        words = [3 + sum(w.encode()) * 31 % (self.n_vocab - 3) for w in text.split()]
        return [1, *words, 2] if add_special else words

    def token_vector(self, token: int) -> np.ndarray:
        return np.random.default_rng(token).standard_normal(self.n_embd).astype(np.float32)

    def embed(self, seqs: list[list[int]]) -> list[np.ndarray]:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        self.calls.append([len(s) for s in seqs])
        return [np.mean([self.token_vector(t) for t in s], axis=0).astype(np.float32) for s in seqs]

    def close(self) -> None:
        self.closed = True
