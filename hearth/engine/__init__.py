"""Token-level engine: continuous batching over a model runner, in its own thread.

The engine never sees JSON, HTTP or chat templates: it takes token ids and sampling
parameters and yields token ids, text deltas, logprobs and a finish reason.
"""

from hearth.engine.engine import Engine
from hearth.engine.types import (
    EngineRequest,
    FinishReason,
    RequestOutput,
    SamplingParams,
    SeqDelta,
    TokenLogprob,
)

__all__ = [
    "Engine",
    "EngineRequest",
    "FinishReason",
    "RequestOutput",
    "SamplingParams",
    "SeqDelta",
    "TokenLogprob",
]
