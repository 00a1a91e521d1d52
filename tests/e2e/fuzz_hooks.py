"""Schemathesis hooks for tests/e2e/test_fuzz.py (loaded through SCHEMATHESIS_HOOKS).

Generated bodies keep every field the schema allows, except that generation is capped at a few
tokens: the fuzzer is after the server's handling of input, not the model's output, and a
thousand cases that each decode to the end of the context would not fit CI's time."""

from __future__ import annotations

from typing import Any

import schemathesis

# Snapshot archives are raw bytes: send generated ones as application/octet-stream would be.
schemathesis.serializer.alias("application/x-tar", "application/octet-stream")

MAX_NEW_TOKENS = 4
# path → the fields that cap generation (the first is set when none is given)
CAPS = {
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/completions": ("max_tokens",),
    "/completions": ("max_tokens",),
    "/v1/messages": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
    "/responses": ("max_output_tokens",),
}


OLLAMA = ("/api/chat", "/api/generate")  # the cap is options.num_predict
# pull and delete name models: a generated name is kept out of the catalog's (a pull of one would
# download it) by a prefix no catalog id has
MODEL_NAMING = ("/api/pull", "/api/delete")


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    if case.operation.path in MODEL_NAMING and isinstance(case.body, dict):
        for key in ("model", "name"):
            if isinstance(case.body.get(key), str):
                case.body[key] = "fuzz-" + case.body[key]
        return
    if case.operation.path in OLLAMA and isinstance(case.body, dict):
        options = case.body.get("options")
        if not isinstance(options, dict):
            options = case.body["options"] = {} if options is None else options
        if isinstance(options, dict):
            n = options.get("num_predict")
            if not (isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_NEW_TOKENS):
                options["num_predict"] = MAX_NEW_TOKENS
        return
    fields = CAPS.get(case.operation.path)
    if fields is None or not isinstance(case.body, dict):
        return
    for key in fields:
        value = case.body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_NEW_TOKENS:
            case.body[key] = MAX_NEW_TOKENS
    if not any(key in case.body for key in fields):
        case.body[fields[0]] = MAX_NEW_TOKENS
