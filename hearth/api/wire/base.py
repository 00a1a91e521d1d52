"""What every answer model shares (the package docstring says why these are models at all):
Hearth's own objects forbid unknown fields; the protocols' objects (OpenAI, Anthropic, Ollama)
allow them, as their clients do. And two fields more than one protocol answers with."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class HearthModel(BaseModel):
    """One of Hearth's own objects: an unknown field is a defect of the document."""

    model_config = ConfigDict(extra="forbid")


class ProtocolModel(BaseModel):
    """An object of a protocol Hearth speaks: fields beyond those written here are allowed."""

    model_config = ConfigDict(extra="allow")


# Why generation stopped where the protocol has no word for it: the loop detector or the time
# cap (hearth.engine.types.StopKind; tests/unit/test_wire_stop_reasons.py keeps the two equal).
StopReason = Literal["repetition", "timeout"]


class LlamaTimings(ProtocolModel):
    """llama-server's `timings` (docs/api.md, "Run options")."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    cache_tier: Literal["slot", "ram", "disk"] | None = None  # where cache_n came from (Hearth's)
