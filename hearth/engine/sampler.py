"""Log-probabilities of sampled tokens, from the raw logits (the model's distribution,
before temperature and truncation, as OpenAI and vLLM report them)."""

from __future__ import annotations

import numpy as np

from hearth.engine.runner import Runner
from hearth.engine.types import TokenLogprob


def token_logprob(runner: Runner, logits_index: int, token: int, top_n: int) -> TokenLogprob:
    logits = runner.logits(logits_index).astype(np.float64, copy=False)
    m = float(logits.max())
    lse = m + float(np.log(np.exp(logits - m).sum()))
    top: list[tuple[int, bytes, float]] = []
    if top_n > 0:
        idx = np.argpartition(-logits, top_n - 1)[:top_n]
        idx = idx[np.argsort(-logits[idx], kind="stable")]
        top = [(int(i), runner.token_bytes(int(i)), float(logits[i]) - lse) for i in idx]
    return TokenLogprob(token, runner.token_bytes(token), float(logits[token]) - lse, top)
