"""The backend contract: everything above `backends/` (api, sessions, observability, cli)
talks to a backend through these types and nothing else, as vLLM's serving layer talks to
one `EngineClient`. A backend may run the model here (`LocalBackend`) or elsewhere (a pool of
remote engines reached over HTTP); nothing above this module can tell.

Generation: `chat()` and `complete()` validate eagerly and raise a `HearthError` before
returning the stream, so the HTTP layer can still answer with a 4xx; once the stream is
returned, problems arrive as a `Finish(reason="error")` and `Done(error=...)`.
Closing the stream (`aclose()`, or cancelling the task that iterates it) cancels the work.

Token work (`tokenize`, `tokenize_prompt`, ...) is async: a backend must not run it on the event
loop (a long prompt takes seconds to template and tokenize), and a remote one makes a call.

Capabilities: a backend that cannot do something optional says so by returning None from the
capability's property (today: `session_kv`, `prompt_cache`, `model_loading`, `embeddings`); the
`require_...` functions turn that into the one error the API answers with, a 404
`sessions_unsupported` or `prompt_cache_unsupported` (what a client sees from a server without
them), never an AttributeError.

One module per part, all re-exported here: everything above `backends/` imports this package,
never its modules (tests/unit/test_layering.py).
- backend.py: the `Backend` Protocol and the `require_...` functions;
- stream.py: `EventStream`, what `chat()` and `complete()` return;
- model_info.py: `ModelCard`, `ModelLimits`, `ModelStats`;
- session_kv.py, prompt_cache.py, model_loading.py, embeddings.py: one optional capability
  each, its Protocol and its value types.
"""

from hearth.backends.base.backend import (
    Backend,
    require_embeddings,
    require_model_loading,
    require_prompt_cache,
    require_session_kv,
)
from hearth.backends.base.embeddings import Embeddings, EmbedRequest, EmbedResult
from hearth.backends.base.model_info import ModelCard, ModelLimits, ModelStats
from hearth.backends.base.model_loading import LoadStats, ModelLoading
from hearth.backends.base.prompt_cache import PromptBlocks, PromptCache
from hearth.backends.base.session_kv import KVIdentity, KVInfo, KVState, Residency, SessionKV
from hearth.backends.base.stream import EventStream
from hearth.engine.fair_share import TenantTally
from hearth.engine.prefix_cache.stats import CacheEntry, PrefixCacheStats, TierStats

__all__ = [
    "Backend", "CacheEntry", "EmbedRequest", "EmbedResult", "Embeddings", "EventStream", "KVIdentity", "KVInfo",
    "KVState", "LoadStats", "ModelCard", "ModelLimits", "ModelLoading", "ModelStats", "PrefixCacheStats",
    "PromptBlocks", "PromptCache", "Residency", "SessionKV", "TenantTally", "TierStats", "require_embeddings",
    "require_model_loading", "require_prompt_cache", "require_session_kv",
]
