"""What a step hands back: one RequestOutput per request it touched, filled one token at a time.

`emit` is the one place that decides per token (EOS, stop tokens and strings, repetition,
limits). The engine calls it (through `Engine._emit`) for every token a sequence emits, one at
a time, also when a speculative draft is accepted several tokens at once. Runs on the engine
thread; the outputs are handed to each request's sink at the end of the step.
"""

from __future__ import annotations

from hearth.engine.detokenizer import StopMatch
from hearth.engine.runner import Runner
from hearth.engine.sampler import token_logprob
from hearth.engine.sequence import ActiveRequest, Sequence
from hearth.engine.types import FinishReason, RequestOutput, SeqDelta, StopKind


class StepOutputs:
    """Deltas gathered during one step, one RequestOutput per request."""

    def __init__(self) -> None:
        self.by_request: dict[str, tuple[ActiveRequest, RequestOutput]] = {}

    def delta(self, ar: ActiveRequest, index: int) -> SeqDelta:
        _, out = self.by_request.setdefault(
            ar.request_id,
            (ar, RequestOutput(ar.request_id, [], len(ar.prompt), ar.cached_tokens, cache_tier=ar.cache_tier,
                               prefill_chunks=ar.prefill_chunks)))
        for d in out.deltas:
            if d.index == index:
                return d
        d = SeqDelta(index)
        out.deltas.append(d)
        return d

    def finish(self, ar: ActiveRequest, reason: FinishReason, error: str | None = None,
               stop_reason: str | None = None, cache_written: int = 0) -> None:
        """Close a request's output (for `Engine._end`): every live candidate finishes with
        `reason`, its held-back text flushed, and the request is marked finished."""
        indices = [s.index for s in ar.seqs] or list(range(ar.req.n))
        live = {s.index for s in ar.live_seqs()} if ar.seqs else set(indices)
        for seq in ar.seqs:
            if seq.finish is None:
                seq.finish = reason
                self.delta(ar, seq.index).text += seq.detok.flush()
        for i in indices:
            if i in live:
                d = self.delta(ar, i)
                d.finish_reason = reason
                d.stop_reason = stop_reason
        self.delta(ar, 0)  # make sure the request has an output
        _, out = self.by_request[ar.request_id]
        out.finished = True
        out.error = error
        out.cache_written = cache_written

def emit(runner: Runner, ar: ActiveRequest, seq: Sequence, token: int, logits_index: int,
         delta: SeqDelta) -> FinishReason | None:
    """Add one sampled token of one candidate to its delta and decide whether the candidate
    goes on: None if it does, else why it finished (already set on `seq` and `delta`)."""
    params = ar.req.params
    if seq.think is not None:
        seq.think.observe(runner.token_text(token))
    seq.n_generated += 1
    delta.token_ids.append(token)
    if params.logprobs:
        if delta.logprobs is None:
            delta.logprobs = []
        delta.logprobs.append(token_logprob(runner, logits_index, token, params.top_logprobs))

    finish: FinishReason | None = None
    # A grammar allows only end-of-generation once complete, so EOS always ends it there.
    eos_stops = not params.ignore_eos or params.grammar is not None
    if (eos_stops and runner.is_eog(token)) or token in params.stop_token_ids:
        finish, delta.stop_reason = FinishReason.STOP, token
        delta.text += seq.detok.flush()
    else:
        pushed = seq.detok.push(runner.token_bytes(token))
        if isinstance(pushed, StopMatch):
            finish, delta.stop_reason = FinishReason.STOP, pushed.stop
            delta.text += pushed.text
        else:
            delta.text += pushed
            at_max = params.max_tokens is not None and seq.n_generated >= params.max_tokens
            if seq.repeat is not None and seq.repeat.observe(token):
                finish, delta.stop_reason = FinishReason.STOP, StopKind.REPETITION
                delta.text += seq.detok.flush()
            elif at_max or len(ar.prompt) + seq.n_generated >= ar.max_len:
                finish = FinishReason.LENGTH
                delta.text += seq.detok.flush()
    if finish is not None:
        seq.finish = finish
        delta.finish_reason = finish
    return finish
