"""Per-run fields every generating protocol accepts beside its own: the wall-clock cap under
Unsloth's name, loop detection (superlinear's `repetition_detection`, top level or inside
`extra`), `stream_thinking` and timings. Mixed into each protocol's request model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from hearth.api.http import runs
from hearth.api.http.stream_shaping import coalesce, hold_reasoning
from hearth.chat.types import ChatEvent, Finish, RepetitionSpec, StopKind
from hearth.config import Settings
from hearth.errors import BadRequest


class RepetitionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: StrictBool = True
    min_repeats: StrictInt | None = None
    max_period: StrictInt | None = None
    min_tokens: StrictInt | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False
    flush_every_n_tokens: StrictInt | None = Field(default=None, ge=1, le=100_000)
    flush_every_ms: float | None = Field(default=None, gt=0, le=60_000)


class RunFields(BaseModel):
    stream_options: StreamOptions | None = None
    timeout: float | None = Field(default=None, gt=0)  # seconds
    t_max_predict_ms: float | None = Field(default=None, gt=0)  # Unsloth's name for the same cap, in ms
    repetition_detection: StrictBool | RepetitionIn | None = None
    extra: dict[str, Any] | None = None  # superlinear's bag of extensions
    stream_thinking: StrictBool = True  # false: reasoning only in the final event, not streamed


def shape(events: AsyncIterator[ChatEvent], body: RunFields) -> AsyncIterator[ChatEvent]:
    """The stream's events as the request asked them grouped (flush control, held reasoning)."""
    if not body.stream_thinking:
        events = hold_reasoning(events)
    opts = body.stream_options
    if opts is not None and (opts.flush_every_n_tokens or opts.flush_every_ms):
        events = coalesce(events, opts.flush_every_n_tokens, opts.flush_every_ms)
    return events


def stop_fields(finish: Finish | None) -> dict[str, Any]:
    """The extra keys of a choice (or a response) that Hearth itself stopped: `stop_reason`
    for the loop detector, `error` for a malformed tool call."""
    out: dict[str, Any] = {}
    if finish is not None and isinstance(finish.stop_reason, StopKind):
        out["stop_reason"] = finish.stop_reason.value
    if finish is not None and finish.error:
        out["error"] = {"type": "malformed_tool_call", "message": finish.error}
    return out


def wall_cap(settings: Settings, body: RunFields) -> float:
    if body.timeout is not None and body.t_max_predict_ms is not None:
        raise BadRequest("give the wall-clock cap once: timeout (seconds) or t_max_predict_ms, not both",
                         param="t_max_predict_ms")
    if body.t_max_predict_ms is not None:
        return runs.time_cap(settings, body.t_max_predict_ms / 1000, param="t_max_predict_ms")
    return runs.time_cap(settings, body.timeout)


def repetition(settings: Settings, body: RunFields) -> RepetitionSpec | None:
    """The request's loop detection: its own setting, else the server's (--repetition-detection)."""
    asked: bool | RepetitionIn | None = body.repetition_detection
    param = "repetition_detection"
    if asked is None and body.extra and "repetition_detection" in body.extra:
        param = "extra.repetition_detection"
        try:
            asked = RunFields.model_validate({"repetition_detection": body.extra[param[6:]]}).repetition_detection
        except ValidationError as e:
            raise BadRequest(f"{param}: must be true, false or an object with enabled, min_repeats, "
                             f"max_period, min_tokens ({e.errors()[0]['msg']})", param=param) from e
    if asked is None:
        return RepetitionSpec() if settings.repetition_detection else None
    if isinstance(asked, bool):
        return RepetitionSpec(enabled=asked)
    try:
        return RepetitionSpec(enabled=asked.enabled,
                              **{k: v for k, v in asked.model_dump(exclude={"enabled"}).items() if v is not None})
    except ValueError as e:
        raise BadRequest(f"{param}: {e}", param=param) from e
