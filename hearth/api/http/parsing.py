"""Turning request bodies into typed values: JSON, pydantic validation, sampling params.

Every failure here is a BadRequest naming the offending field, never a 500.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request

from hearth.api.http.body import parse_json, read_limited
from hearth.chat.schema_bounds import check_grammar
from hearth.chat.types import InvalidParam, SamplingParams
from hearth.errors import BadRequest

M = TypeVar("M", bound=BaseModel)


class OpenBody(BaseModel):
    """A protocol's request body: fields this server does not use (OpenAI's many options,
    Anthropic's cache_control, citations, service_tier, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="allow")


class StrictBody(BaseModel):
    """A body of Hearth's own API: an unknown field is a 400."""

    model_config = ConfigDict(extra="forbid")


async def read_json(request: Request) -> dict[str, Any]:
    body = await read_limited(request)
    if not body:
        raise BadRequest("the request body is empty; expected a JSON object")
    data = await parse_json(body)
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


async def read_json_or_empty(request: Request) -> dict[str, Any]:
    """For endpoints whose body is optional: no body means {}."""
    return await read_json(request) if await read_limited(request) else {}


def validate(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-"))
        raise BadRequest(f"{loc}: {err['msg']}" if loc else err["msg"], param=loc or None) from e


def sampling_params(**kw: Any) -> SamplingParams:
    """Build SamplingParams from request fields (None means: the default)."""
    values = {k: v for k, v in kw.items() if v is not None}
    if isinstance(values.get("grammar"), str):
        check_grammar(values["grammar"], "grammar")
    try:
        return SamplingParams(**values)
    except InvalidParam as e:
        raise BadRequest(str(e), param=e.param) from e


def first_set(*values: float | None) -> float | None:
    """The first value given, 0 included (`a or b` would take 0 for "not given")."""
    return next((v for v in values if v is not None), None)


def parse_logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if bias is None:
        return None
    out: dict[int, float] = {}
    for k, v in bias.items():
        try:
            out[int(k)] = float(v)
        except (TypeError, ValueError) as e:
            raise BadRequest(f"logit_bias keys must be token ids, got {k!r}", param="logit_bias") from e
    return out


def parse_stop(stop: str | list[str] | None) -> list[str] | None:
    if stop is None:
        return None
    return [stop] if isinstance(stop, str) else list(stop)
