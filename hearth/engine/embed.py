"""The embedding engine: one thread per embedding model that packs the sequences of every
waiting request into shared `llama_decode` calls and hands back one pooled vector per sequence.

Packing: sequences are taken first come, first served, whole (an encoder sees a sequence in
one pass, so one is never split across calls), while the call's tokens stay within the
runner's `n_batch` and its sequences within `n_seq_max`. A request of 256 short inputs fills a
few calls; 16 clients of one input each share one. A sequence's vector depends only on its own
tokens (each sequence attends to its own tokens only, and pooling is per sequence), so where a
sequence lands in a call does not change it: tests/e2e/test_embeddings.py checks alone, batched
and concurrent vectors for equality.

A request whose cancel flag is set (its client left) before its sequences are decoded is
dropped from the queue; one already in a call finishes that call and its vectors are dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

log = logging.getLogger("hearth.embed")


class EmbedRunner(Protocol):
    """What the engine needs of a model: `embed` runs one call over whole sequences and returns
    each one's pooled (not normalised) vector, in order. Called from the engine thread only."""

    n_batch: int  # most tokens in one call
    n_seq_max: int  # most sequences in one call
    n_embd: int

    def embed(self, seqs: list[list[int]]) -> list[np.ndarray]: ...

    def close(self) -> None: ...


@dataclass(eq=False, slots=True)
class EmbedJob:
    seqs: list[list[int]]
    cancelled: threading.Event = field(default_factory=threading.Event)
    future: Future[list[np.ndarray]] = field(default_factory=Future)
    vectors: list[np.ndarray | None] = field(default_factory=list)
    next: int = 0  # the first sequence not yet handed to a call
    done: int = 0

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.seqs)


@dataclass(slots=True)
class EmbedStats:
    calls: int = 0
    sequences: int = 0
    tokens: int = 0


class EmbedEngine:
    def __init__(self, runner: EmbedRunner, name: str = "embed") -> None:
        self.runner = runner
        self.stats = EmbedStats()
        self._inbox: queue.SimpleQueue[EmbedJob | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._stopped = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; jobs still waiting fail with RuntimeError."""
        if self._stopped:
            return
        self._stopped = True
        self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join()

    def submit(self, seqs: list[list[int]]) -> EmbedJob:
        """Queue `seqs` (each non-empty, at most `n_batch` tokens: the caller checks); the job's
        future gets their pooled vectors in order."""
        if self._stopped:
            raise RuntimeError("the embedding engine is stopped")
        for s in seqs:
            if not s or len(s) > self.runner.n_batch:
                raise ValueError(f"a sequence of {len(s)} tokens cannot be embedded (1..{self.runner.n_batch})")
        job = EmbedJob(seqs)
        if not seqs:
            job.future.set_result([])
        else:
            self._inbox.put(job)
        return job

    # ---- the thread --------------------------------------------------------------------------

    def _loop(self) -> None:
        waiting: deque[EmbedJob] = deque()
        while True:
            if not waiting:
                item = self._inbox.get()
                if item is None:
                    break
                waiting.append(item)
            stop = False
            while True:  # everything that arrived meanwhile joins this round
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                waiting.append(item)
            if stop:
                break
            self._step(waiting)
        for job in waiting:
            if not job.future.done():
                job.future.set_exception(RuntimeError("the embedding engine stopped"))

    def _step(self, waiting: deque[EmbedJob]) -> None:
        """One call: whole sequences, first come first served, within the token and sequence caps.
        Nothing is in flight between calls, so a cancelled job leaves the queue whole here."""
        for job in [j for j in waiting if j.cancelled.is_set()]:
            waiting.remove(job)
            job.future.cancel()
        batch: list[tuple[EmbedJob, int]] = []
        tokens = 0
        for job in waiting:
            while job.next < len(job.seqs) and len(batch) < self.runner.n_seq_max:
                n = len(job.seqs[job.next])
                if tokens + n > self.runner.n_batch:
                    break
                batch.append((job, job.next))
                tokens += n
                job.next += 1
            if job.next < len(job.seqs):
                break  # the rest waits for the next call, keeping the order
        if not batch:
            return
        try:
            vectors = self.runner.embed([job.seqs[i] for job, i in batch])
        except Exception as e:  # the model failed: every job in the call fails, the rest go on
            log.exception("embedding call failed")
            for job in {id(j): j for j, _ in batch}.values():
                if not job.future.done():
                    job.future.set_exception(e)
                waiting.remove(job)
            return
        self.stats.calls += 1
        self.stats.sequences += len(batch)
        self.stats.tokens += tokens
        for (job, i), vec in zip(batch, vectors, strict=True):
            job.vectors[i] = vec
            job.done += 1
        for job in [j for j in waiting if j.done == len(j.seqs)]:
            waiting.remove(job)
            if job.cancelled.is_set():
                job.future.cancel()
            else:
                job.future.set_result([v for v in job.vectors if v is not None])


def normalize(vec: np.ndarray) -> np.ndarray:
    """L2 normalisation as sentence-transformers' Normalize (and llama-server's embd_normalize 2):
    a zero vector stays zero."""
    v = np.asarray(vec, dtype=np.float32)
    norm = float(np.linalg.norm(v.astype(np.float64)))
    return v if norm == 0.0 else (v / norm).astype(np.float32)
