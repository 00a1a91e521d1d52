"""The OpenAPI document's answer shapes (hearth.api.openai.wire) name every stop reason the engine gives:
a client validating answers against the document must accept an answer the time cap ended (the
fuzzer found `stop_reason: "timeout"` outside the schema)."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from hearth.api.openai.wire import ChatChoice, Response, TextChoice
from hearth.engine.types import StopKind


@pytest.mark.parametrize("model", [ChatChoice, TextChoice, Response])
def test_every_stop_kind_is_in_the_answer_schema(model: type) -> None:
    field = TypeAdapter(model.model_fields["stop_reason"].annotation)  # type: ignore[attr-defined]
    for kind in StopKind:
        assert field.validate_python(kind.value) == kind.value
    with pytest.raises(ValidationError):
        field.validate_python("not-a-stop-kind")
