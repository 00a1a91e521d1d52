"""The request fields the generating protocols share, declared once, and what they become.

- `RunFields`, in every generating protocol (Chat, Completions, Responses, Messages): the
  sampling fields all four take, `cancel_id`, `cache_prompt`, the wall-clock cap under
  Unsloth's name too, loop detection (superlinear's `repetition_detection`, top level or inside
  `extra`), `stream_thinking`, stream flushing and `lenient_tool_calls`; `sampling()` is the
  one conversion of them (plus the protocol's own: its max-tokens and stop fields) to
  `SamplingParams`.
- `OpenAIRunFields` adds what OpenAI's protocols (and llama.cpp's extensions to them) take:
  min_p, seed, stop; `SamplerFields` the rest of llama.cpp's sampler that Chat and Completions
  take (penalties under both names, logit_bias, speculative decoding).
- `SessionFields`: Hearth sessions on the chat protocols (docs/sessions.md).
- `ConversationFields`: the conversation key a stateless chat request may carry in its body
  (`prompt_cache_key`; `hearth.http.cache_keys` reads it with the other sources).

A protocol declares only the fields of its own (its max tokens, stop under its own name,
tools, ...): a field it does not declare stays what it was, accepted and ignored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from hearth.api.http import runs
from hearth.api.http.stream_shaping import coalesce, hold_reasoning
from hearth.chat.types import ChatEvent, Finish, RepetitionSpec, SamplingParams, SessionTurn, StopKind
from hearth.config import Settings, parse_duration
from hearth.errors import BadRequest
from hearth.http.parsing import first_set, parse_logit_bias, parse_stop, sampling_params
from hearth.sessions.ids import check_session_id
from hearth.tenants import class_name


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
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    ignore_eos: bool | None = None  # llama.cpp's extension, on every protocol
    cancel_id: str | None = Field(default=None, min_length=1, max_length=256)  # for POST /v1/cancel
    cache_prompt: bool = True
    stream_options: StreamOptions | None = None
    timeout: float | None = Field(default=None, gt=0)  # seconds
    t_max_predict_ms: float | None = Field(default=None, gt=0)  # Unsloth's name for the same cap, in ms
    repetition_detection: StrictBool | RepetitionIn | None = None
    extra: dict[str, Any] | None = None  # superlinear's bag of extensions
    stream_thinking: StrictBool = True  # false: reasoning only in the final event, not streamed
    # false: a tool call counts only in the template's own format, not as bare or fenced JSON
    # (default: the server's --lenient-tool-calls)
    lenient_tool_calls: StrictBool | None = None
    # vLLM's name: prompts with different salts share no cached KV, within the caller's own
    # prompt-cache namespace (docs/api.md, "Prompt cache and tenants")
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    # how long the model stays loaded after this request (Ollama's: seconds or "5m"; 0 unloads
    # it at once, negative never); None: the server's --keep-alive
    keep_alive: float | str | None = None
    # Hearth's admission class (flex, default, priority; hearth/engine/fair_share.py), capped by
    # the key's max_priority; None: the key's default class
    priority: str | None = None

    def asked_class(self) -> str | None:
        """The class the body asks for, by name; BadRequest naming the field if it is unknown."""
        return check_class("priority", self.priority)

    def sampling(self, **own: Any) -> SamplingParams:
        """The request's SamplingParams: the shared fields it declares and the protocol's `own`
        (None means: the default). A BadRequest names the field at fault."""
        return sampling_params(**self.sampling_fields(), **own)

    def sampling_fields(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "ignore_eos": self.ignore_eos}


class OpenAIRunFields(RunFields):
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    service_tier: str | None = None  # OpenAI's name for the class: auto, default, flex, priority

    def asked_class(self) -> str | None:
        # Hearth's own field, when both are given
        tier = check_class("service_tier", self.service_tier)
        return super().asked_class() or tier

    def sampling_fields(self) -> dict[str, Any]:
        return super().sampling_fields() | {"min_p": self.min_p, "seed": self.seed, "stop": parse_stop(self.stop)}


class SamplerFields(OpenAIRunFields):
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    repeat_penalty: float | None = None  # llama.cpp's name
    logit_bias: dict[str, float] | None = None
    speculative: bool | None = None  # prompt-lookup speculative decoding (default: the server's --spec-draft)

    def sampling_fields(self) -> dict[str, Any]:
        return super().sampling_fields() | {
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": first_set(self.repetition_penalty, self.repeat_penalty),
            "logit_bias": parse_logit_bias(self.logit_bias), "speculative": self.speculative}


class SessionFields(BaseModel):
    """Hearth sessions (docs/sessions.md): with a session_id the request carries only the new messages."""

    session_id: str | None = None
    replace_system: bool = False
    discard_thinking: bool = False
    session_wait: bool = True
    session_create: bool = True

    def session_turn(self) -> SessionTurn | None:
        if self.session_id is None:
            return None
        return SessionTurn(check_session_id(self.session_id), self.replace_system, self.discard_thinking,
                           self.session_wait, self.session_create)


class ConversationFields(BaseModel):
    prompt_cache_key: str | None = None  # OpenAI's; read on every chat protocol


@dataclass(frozen=True, slots=True)
class RunLimits:
    """What a run may take, as the server allows it: the wall-clock cap and loop detection; and
    how its tool calls are read (the request's lenient_tool_calls, else the server's)."""

    timeout: float | None = None
    repetition: RepetitionSpec | None = None
    lenient_tool_calls: bool = True
    keep_alive: float | None = None  # seconds (inf: forever); None: the server's
    priority: str | None = None  # the admission class asked for (service_tier or priority); None: the key's


def run_limits(settings: Settings, body: RunFields) -> RunLimits:
    lenient = settings.lenient_tool_calls if body.lenient_tool_calls is None else body.lenient_tool_calls
    return RunLimits(wall_cap(settings, body), repetition(settings, body), lenient, keep_alive(body.keep_alive),
                     body.asked_class())


def check_class(field: str, value: str | None) -> str | None:
    """A class name as a request gives it (`auto` is `default`); BadRequest if it is none."""
    if value is None:
        return None
    try:
        return class_name(value)
    except ValueError as e:
        raise BadRequest(f"{field} {e}", param=field) from None


def keep_alive(asked: float | str | None) -> float | None:
    """A request's keep_alive in seconds (Ollama's meaning; inf: forever); BadRequest if unreadable."""
    if asked is None:
        return None
    try:
        return parse_duration(asked)
    except ValueError as e:
        raise BadRequest(f"keep_alive: {e}", param="keep_alive") from e


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
