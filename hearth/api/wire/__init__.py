"""The node's answers, written down once as pydantic models: the one contract the OpenAPI document
(`hearth.api.openapi`) is built from and the tests check real answers against.

One way to build, one way to describe. The handlers build every answer as a plain dict (the
protocols' own wire format, field for field) and encode it once with orjson; these models are
never built on the request path. Why: a chat completion as a dict encodes in ~0.2 µs, through
its model (validate, then dump) in ~5 µs, a cost a per-token SSE chunk must not pay; and the
streams carry the whole objects too (a Responses stream's response, an Anthropic message_start,
Ollama's last line), so building whole answers from models while chunks stay dicts would spell
each shape twice. So the dicts are the builders and the models the contract, and tests keep the
two together: tests/api/test_openapi.py checks each route's real answer and the streams' whole
objects against their models, and that no model is left out of the document; the schema fuzzer
(tests/e2e/test_fuzz.py) checks thousands of the real server's answers against the document.

Where each protocol's shapes live, next to the protocol:
- `hearth.api.openai.wire`: Chat Completions, Completions, Responses, embeddings, OpenAI's error;
- `hearth.api.anthropic.wire`: Messages, count_tokens, Anthropic's error;
- `hearth.api.ollama.wire`: Ollama's /api/* answers and error;
- `hearth.api.batches.wire`: files and batches (OpenAI's Batch API);
- here, Hearth's own API: `control` (models, health, tokenizer, cancel), `sessions` (sessions and
  snapshots), `prompt_cache` (stats, entries, digest, blocks), `usage` (keys, the usage ledger,
  the journal); and `base`, the pieces every protocol shares.
"""
