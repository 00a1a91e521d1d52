"""Turning request bodies into typed values: JSON, pydantic validation, sampling params.

Every failure here is a BadRequest naming the offending field, never a 500.

An explicit `null` on a protocol body is "the default", as OpenAI's and Anthropic's clients
mean it (their types declare nearly every optional field nullable, and SDKs and proxies send
`"n": null`, `"stream": null`): `OpenBody` drops a null given for a field that has a default
and whose type has no None of its own, so the field takes its default. A field whose type
includes None keeps the null (it means something there, or the same default); a required
field given null stays an error. The OpenAPI document shows those fields as nullable.
"""

from __future__ import annotations

import types
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.fields import FieldInfo
from starlette.requests import Request

from hearth.chat.schema_bounds import check_grammar
from hearth.chat.types import InvalidParam, SamplingParams
from hearth.errors import BadRequest
from hearth.http.body import parse_json, read_limited

M = TypeVar("M", bound=BaseModel)


def _takes_none(field: FieldInfo) -> bool:
    t = field.annotation
    if t is None or t is Any or t is type(None):
        return True
    return get_origin(t) in (Union, types.UnionType) and type(None) in get_args(t)


@cache
def null_is_default(model: type[BaseModel]) -> frozenset[str]:
    """The keys of `model` (as sent: aliases) for which a null means "the default"."""
    return frozenset(f.alias or name for name, f in model.model_fields.items()
                     if not f.is_required() and not _takes_none(f))


def _nullable_in_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """The OpenAPI side of the rule: those fields accept null too."""
    props = schema.get("properties", {})
    for key in null_is_default(model):
        prop = props.get(key)
        if prop is None:
            continue
        outer = {k: prop.pop(k) for k in ("title", "description", "default") if k in prop}
        variants = prop["anyOf"] if set(prop) == {"anyOf"} else [prop]
        props[key] = {"anyOf": [*variants, {"type": "null"}], **outer}


class OpenBody(BaseModel):
    """A protocol's request body: fields this server does not use (OpenAI's many options,
    Anthropic's cache_control, citations, service_tier, ...) are accepted and ignored, and a
    null is the default (the module's docstring)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_nullable_in_schema)

    @model_validator(mode="before")
    @classmethod
    def _drop_default_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            keys = null_is_default(cls)
            if any(data.get(k, 0) is None for k in keys):
                return {k: v for k, v in data.items() if v is not None or k not in keys}
        return data


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
