"""Typed inputs and outputs of the engine (token level)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from hearth.engine.repetition import RepetitionSpec
from hearth.engine.thinking import ThinkBudget

MAX_TOP_LOGPROBS = 20


class FinishReason(StrEnum):
    """Why a sequence ended. Values are the API's own strings."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"


class StopKind(StrEnum):
    """A stop that is neither a stop string nor a token (those are `str` / `int` stop reasons)."""

    REPETITION = "repetition"  # the loop detector ended it (hearth.engine.repetition)
    TIMEOUT = "timeout"  # the time cap ended it (finish "length", as llama-server's t_max_predict_ms)
class InvalidParam(ValueError):
    """A parameter out of range; `param` names it (the API reports it as the error's param)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling. `temperature == 0` means greedy decoding.

    Raises InvalidParam from `__post_init__` on out-of-range values; the API layer turns
    that into a 400 naming the parameter, so nothing invalid ever reaches the native sampler.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    max_tokens: int | None = None  # None: what is left of the context window
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    grammar: str | None = None  # GBNF, for constrained decoding
    # Prompt-lookup speculative decoding (same tokens either way); None: the server's default.
    speculative: bool | None = None

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise InvalidParam(name, f"{name} {what}")

        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty"):
            check(math.isfinite(getattr(self, name)), name, "must be a finite number")
        check(0.0 <= self.temperature <= 100.0, "temperature", "must be between 0 and 100")
        check(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]")
        check(self.top_k >= 0, "top_k", "must be >= 0")
        check(0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]")
        check(0.0 < self.repetition_penalty <= 10.0, "repetition_penalty", "must be in (0, 10]")
        check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]")
        check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]")
        check(self.penalty_last_n >= -1, "penalty_last_n", "must be >= -1")
        check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be >= 1")
        check(0 <= self.top_logprobs <= MAX_TOP_LOGPROBS, "top_logprobs",
              f"must be between 0 and {MAX_TOP_LOGPROBS}")
        check(len(self.stop) <= 16, "stop", "may hold at most 16 strings")
        check(all(s for s in self.stop), "stop", "strings must not be empty")
        for bias in self.logit_bias.values():
            check(math.isfinite(bias) and -100.0 <= bias <= 100.0, "logit_bias", "values must be in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True)
class EngineRequest:
    """A tokenized prompt to complete `n` times (the candidates share the prompt's KV)."""

    request_id: str
    prompt_tokens: list[int]
    params: SamplingParams
    n: int = 1
    # Seconds of generation allowed, counted from the first generated token (llama-server's
    # t_max_predict_ms), so a long prompt's prefill is never cut; then it ends "length" (StopKind.TIMEOUT).
    max_time: float | None = None
    # Reuse a cached prefix of the prompt from a free slot. llama.cpp's kernels are not
    # batch-invariant, so a prefix computed in another batch shape can change low-order bits
    # of the logits; False recomputes the whole prompt, for bit-exact reproducibility.
    cache_prompt: bool = True
    think: ThinkBudget | None = None  # force the end of thinking after a token budget
    # The session whose KV this request continues: its slot (or swapped state) is reused and
    # kept for its next turn. None: a stateless request (it may still reuse a cached prefix).
    owner: str | None = None
    max_len: int | None = None  # prompt + generated tokens cap below the context (a session's max_seq_len)
    repetition: RepetitionSpec | None = None  # stop a sequence that loops
    # The conversation a stateless request belongs to (a client's prompt_cache_key, Claude Code's
    # session id, ...): its slot is reused before strangers' are taken, and the prompt-cache
    # blocks it writes are evicted last. None: a stranger.
    cache_key: str | None = None
    # Prompt tokens a client asked the server to keep (up to its last Anthropic cache_control
    # breakpoint): written to the durable prompt cache, evicted last. 0: none asked for.
    keep_tokens: int = 0
    # The prompt-cache namespace: the request reuses, and writes, only KV of its own namespace
    # (slots, sessions' swapped KV, the prompt cache's blocks). "": the default one.
    cache_ns: str = ""
    # Whose work this is (hearth.tenants): the scheduler charges its tokens to this tenant's
    # fair share (hearth.engine.fair_share). "": the admin, or a node without keys.
    tenant: str = ""
    # Its admission class (hearth.engine.fair_share.Priority: 0 flex, 1 default, 2 priority): a
    # waiting request of a higher class may pause a running one of a lower class (engine/preempt.py).
    priority: int = 1


@dataclass(slots=True)
class TokenLogprob:
    """One generated token with its log-probability and the most likely alternatives."""

    token_id: int
    token_bytes: bytes
    logprob: float
    top: list[tuple[int, bytes, float]]


@dataclass(slots=True)
class SeqDelta:
    """What one candidate produced in one engine step."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or token that ended it, or a StopKind


@dataclass(slots=True)
class RequestOutput:
    """One batch of results for a request, delivered once per engine step it took part in."""

    request_id: str
    deltas: list[SeqDelta]
    prompt_tokens: int
    cached_tokens: int
    finished: bool = False
    error: str | None = None
    # Where the reused prefix came from: "slot" (a KV slot), "ram" or "disk" (the prompt cache's
    # tiers, or swapped session KV); None: nothing reused.
    cache_tier: str | None = None
    # On the final output: prompt tokens within `keep_tokens` this request wrote to the prompt
    # cache (Anthropic's cache_creation_input_tokens).
    cache_written: int = 0
    # Prompt chunks decoded for it so far (chunked prefill; the node's `hearth.prefill` span).
    prefill_chunks: int = 0


@dataclass(slots=True)
class EngineStats:
    """An engine's lifetime counters (read from any thread, racily, for metrics)."""

    steps: int = 0
    prompt_tokens: int = 0  # prefilled (not counting reused prefix)
    cached_tokens: int = 0
    generated_tokens: int = 0
    finished: int = 0
    cancelled: int = 0
    swap_outs: int = 0  # session KV moved out of a slot (to RAM)
    swap_ins: int = 0  # session KV restored into a slot
    drafted_tokens: int = 0  # speculative draft tokens verified
    accepted_tokens: int = 0  # of those, the ones the sampler agreed with (emitted without a step of their own)
    interrupted_decodes: int = 0  # decodes stopped midway by an abort or a more urgent arrival (re-run)
    kv_reprefills: int = 0  # session KV that could not be restored or failed a decode: prefilled again


class ContextOverflow(ValueError):
    """The prompt (plus the requested max_tokens) does not fit in a sequence's context."""

    def __init__(self, n_prompt: int, limit: int, max_tokens: int | None = None) -> None:
        self.n_prompt, self.limit, self.max_tokens = n_prompt, limit, max_tokens
        if max_tokens is None:
            msg = (f"This model's maximum context length is {limit} tokens. However, your prompt "
                   f"has {n_prompt} tokens, which leaves no room for a completion.")
        else:
            msg = (f"This model's maximum context length is {limit} tokens. However, you requested "
                   f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the "
                   f"completion). Please reduce the prompt or max_tokens.")
        super().__init__(msg)


def check_request(req: EngineRequest, max_len: int, n_seq_max: int, n_vocab: int) -> None:
    """Raise ValueError (ContextOverflow for size) if `req` cannot run on an engine with
    `n_seq_max` sequences and `n_vocab` tokens, in `max_len` tokens per sequence."""
    if not req.prompt_tokens:
        raise ValueError("the prompt is empty")
    if not 1 <= req.n <= n_seq_max:
        raise ValueError(f"n must be between 1 and {n_seq_max} (the server's --parallel)")
    # Sizes before the id scans, so the linear scans (on the caller's thread) stay bounded.
    n_prompt = len(req.prompt_tokens)
    if n_prompt >= max_len:
        raise ContextOverflow(n_prompt, max_len)
    mt = req.params.max_tokens
    if mt is not None and n_prompt + mt > max_len:
        raise ContextOverflow(n_prompt, max_len, mt)
    bad = [t for t in req.prompt_tokens if not 0 <= t < n_vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of range [0, {n_vocab})")
    bad = [t for t in (*req.params.logit_bias, *req.params.stop_token_ids) if not 0 <= t < n_vocab]
    if bad:
        raise ValueError(f"logit_bias / stop token id {bad[0]} is out of range [0, {n_vocab})")
