"""Prometheus metrics. The backend's per-model stats (and its prompt cache's, per model and
tier) are read at scrape time (nothing on the hot path); request latencies are observed per
request by a `RequestTimer` on its event stream."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hearth.backends.base import Backend, LoadStats, ModelStats, PrefixCacheStats
from hearth.chat.types import ChatEvent, Finish, TextDelta

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


# (metric, help, ModelStats field); gauges then counters
GAUGES = (("hearth_running_sequences", "Requests decoding or prefilling", "running"),
          ("hearth_waiting_requests", "Requests queued for a slot", "waiting"),
          ("hearth_kv_tokens", "Tokens held in the KV cache (all slots)", "kv_tokens"),
          ("hearth_kv_slots_busy", "KV sequence slots in use", "slots_busy"),
          ("hearth_swapped_kv_ram_bytes", "Swapped-out session KV held in RAM", "swapped_ram_bytes"),
          ("hearth_paused_requests", "Requests paused for a higher class (their KV in RAM or on disk)", "paused"),
          ("hearth_paused_kv_ram_bytes", "KV of paused requests held in RAM (in the --session-ram-mb budget "
           "with the sessions')", "paused_kv_ram_bytes"),
          ("hearth_paused_kv_disk_bytes", "KV of paused requests spilled to disk past that budget",
           "paused_kv_disk_bytes"))

# Fair shares, per model and tenant ("(admin)": the admin and a node without keys): (metric,
# help, TenantTally field); gauges then counters. A tenant's share of the tokens served is its
# `hearth_tenant_tokens_served` over the model's sum; its mean wait, wait seconds over admitted.
TENANT_GAUGES = (("hearth_tenant_queued_requests", "Requests of the tenant queued for a slot", "waiting"),
                 ("hearth_tenant_running_requests", "Requests of the tenant admitted (running or paused)",
                  "running"))
TENANT_COUNTERS = (("hearth_tenant_tokens_served", "Tokens the engine ran for the tenant (prompt and generated)",
                    "served"),
                   ("hearth_tenant_admitted_requests", "Requests of the tenant admitted", "admitted"),
                   ("hearth_tenant_wait_seconds", "Time the tenant's admitted requests waited for a slot",
                    "wait_seconds"),
                   ("hearth_tenant_preemptions", "Requests of the tenant paused for a higher class", "preempted"))
COUNTERS = (("hearth_prompt_tokens", "Prompt tokens prefilled", "prompt_tokens"),
            ("hearth_cached_tokens", "Prompt tokens reused from the KV cache", "cached_tokens"),
            ("hearth_generated_tokens", "Tokens generated", "generated_tokens"),
            ("hearth_engine_steps", "Engine steps (one llama_decode each)", "steps"),
            ("hearth_requests_finished", "Requests finished, any reason", "finished"),
            ("hearth_requests_cancelled", "Requests cancelled in the engine", "cancelled"),
            ("hearth_kv_swap_outs", "Session KV swapped out of a slot", "swap_outs"),
            ("hearth_kv_swap_ins", "Session KV swapped back into a slot", "swap_ins"),
            ("hearth_spec_drafted_tokens", "Speculative (prompt-lookup) draft tokens verified", "drafted_tokens"),
            ("hearth_spec_accepted_tokens", "Draft tokens accepted (emitted without a step of their own)",
             "accepted_tokens"),
            ("hearth_interrupted_decodes",
             "Decodes stopped midway by an abort or a more urgent arrival (their work re-run)",
             "interrupted_decodes"),
            ("hearth_session_kv_reprefills", "Session KV that could not be restored or failed a decode, "
             "dropped and prefilled again from the transcript", "kv_reprefills"),
            ("hearth_grammar_cache_hits", "Constrained requests (response_format, forced tool call, grammar) "
             "whose grammar this model had compiled already", "grammar_cache_hits"),
            ("hearth_grammar_cache_misses", "Grammars compiled against this model's vocabulary (then cached)",
             "grammar_cache_misses"),
            ("hearth_preemptions", "Running requests paused for a waiting one of a higher class", "preemptions"))


# The prompt cache, per model and tier (tier = slot, ram, disk): (metric, help, TierStats field,
# the tiers it is reported for). Slots hold sequences, not blocks: only hits count there.
CACHE_TIER_GAUGES = (("hearth_prompt_cache_blocks", "Prompt-cache blocks held", "blocks", ("ram", "disk")),
                     ("hearth_prompt_cache_bytes", "Prompt-cache bytes held", "bytes", ("ram", "disk")),
                     ("hearth_prompt_cache_budget_bytes", "Prompt-cache bytes allowed (0: the tier is off)", "budget",
                      ("ram", "disk")))
CACHE_TIER_COUNTERS = (("hearth_prompt_cache_hits", "Placements whose reused prefix came from this tier", "hits",
                        ("slot", "ram", "disk")),
                       ("hearth_prompt_cache_hit_tokens", "Prompt tokens served from this tier", "tokens",
                        ("slot", "ram", "disk")),
                       ("hearth_prompt_cache_evictions", "Blocks dropped from this tier for its budget", "evictions",
                        ("ram", "disk")))
# The prompt cache, per model: (metric, help, PrefixCacheStats field).
CACHE_COUNTERS = (("hearth_prompt_cache_misses", "Placements that reused no cached prefix", "misses"),
                  ("hearth_prompt_cache_written_blocks", "Prompt-cache blocks written to disk", "written_blocks"),
                  ("hearth_prompt_cache_write_errors", "Prompt-cache block writes that failed", "write_errors"),
                  ("hearth_prompt_cache_dropped_offers", "Prompts not cached: the writer's backlog was full",
                   "dropped_offers"),
                  ("hearth_prompt_cache_loaded_bytes", "Prompt-cache bytes read from disk into RAM", "loaded_bytes"),
                  ("hearth_prompt_cache_load_seconds", "Time spent reading prompt-cache blocks from disk",
                   "load_seconds"),
                  ("hearth_prompt_cache_rejected_files", "Truncated, corrupt, foreign or hostile cache files ignored",
                   "rejected_files"))


# Models loaded on demand, per model: (metric, help, LoadStats field). The engine's counters above
# belong to one load of a model: they start again from 0 when it is loaded again.
LOAD_GAUGES = (("hearth_model_loaded", "1 while the model is loaded", "loaded"),
               ("hearth_model_loaded_bytes", "Memory the model's load took (RSS after minus before; 0 unloaded)",
                "loaded_bytes"))
LOAD_COUNTERS = (("hearth_model_loads", "Model loads that succeeded", "loads"),
                 ("hearth_model_load_failures", "Model loads that failed", "load_failures"),
                 ("hearth_model_load_seconds", "Time spent loading the model", "load_seconds"))


def tenant_label(tenant: str) -> str:
    return tenant or "(admin)"  # no tenant name holds parentheses (hearth.tenants.NAME)


def share_families(stats: dict[str, ModelStats]) -> list[GaugeMetricFamily | CounterMetricFamily]:
    """Per tenant: queue, running, tokens served, share, waits, preemptions; per class: queued
    and paused requests."""
    families: list[GaugeMetricFamily | CounterMetricFamily] = []
    for kind, table in ((GaugeMetricFamily, TENANT_GAUGES), (CounterMetricFamily, TENANT_COUNTERS)):
        for name, doc, attr in table:
            family = kind(name, doc, labels=["model", "tenant"])
            for mid, st in stats.items():
                for tenant, tally in st.tenants.items():
                    family.add_metric([mid, tenant_label(tenant)], getattr(tally, attr))
            families.append(family)
    share = GaugeMetricFamily("hearth_tenant_token_share", "The tenant's fraction of the tokens served",
                              labels=["model", "tenant"])
    for mid, st in stats.items():
        total = sum(t.served for t in st.tenants.values())
        for tenant, tally in st.tenants.items():
            share.add_metric([mid, tenant_label(tenant)], tally.served / total if total else 0.0)
    families.append(share)
    for name, doc, attr in (("hearth_queued_requests_by_class", "Requests queued for a slot, by class",
                             "queued_by_class"),
                            ("hearth_paused_requests_by_class", "Requests paused for a higher class, by class",
                             "paused_by_class")):
        family = GaugeMetricFamily(name, doc, labels=["model", "class"])
        for mid, st in stats.items():
            for cls in ("priority", "default", "flex"):
                family.add_metric([mid, cls], getattr(st, attr).get(cls, 0))
        families.append(family)
    return families


def load_families(stats: dict[str, LoadStats]) -> list[GaugeMetricFamily | CounterMetricFamily]:
    families: list[GaugeMetricFamily | CounterMetricFamily] = []
    for kind, table in ((GaugeMetricFamily, LOAD_GAUGES), (CounterMetricFamily, LOAD_COUNTERS)):
        for name, doc, attr in table:
            family = kind(name, doc, labels=["model"])
            for mid, st in stats.items():
                family.add_metric([mid], float(getattr(st, attr)))
            families.append(family)
    return families


def cache_families(stats: dict[str, PrefixCacheStats]) -> list[GaugeMetricFamily | CounterMetricFamily]:
    """The prompt cache's series, one sample per model (and tier) for each field."""
    families: list[GaugeMetricFamily | CounterMetricFamily] = []
    for kind, tier_table in ((GaugeMetricFamily, CACHE_TIER_GAUGES), (CounterMetricFamily, CACHE_TIER_COUNTERS)):
        for name, doc, attr, tiers in tier_table:
            family = kind(name, doc, labels=["model", "tier"])
            for mid, st in stats.items():
                for tier in tiers:
                    family.add_metric([mid, tier], getattr(st.tiers[tier], attr))
            families.append(family)
    full = GaugeMetricFamily("hearth_prompt_cache_disk_full",
                             "1 while a full disk has stopped prompt-cache writes (serving goes on)", labels=["model"])
    for mid, st in stats.items():
        full.add_metric([mid], 1 if st.disk_full else 0)
    families.append(full)
    for name, doc, field in CACHE_COUNTERS:
        counter = CounterMetricFamily(name, doc, labels=["model"])
        for mid, st in stats.items():
            counter.add_metric([mid], getattr(st, field))
        families.append(counter)
    return families


class BackendCollector(Collector):
    """The backend's `stats()`, one sample per model for each field, its prompt cache's
    `cache_stats()` and its models' `load_stats()` (none without the capability)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        stats: dict[str, ModelStats] = self.backend.stats()
        families: list[GaugeMetricFamily | CounterMetricFamily] = []
        for kind, table in ((GaugeMetricFamily, GAUGES), (CounterMetricFamily, COUNTERS)):
            for name, doc, attr in table:
                family = kind(name, doc, labels=["model"])
                for mid, st in stats.items():
                    family.add_metric([mid], getattr(st, attr))
                families.append(family)
        families.extend(share_families(stats))
        cache = self.backend.prompt_cache
        if cache is not None:
            families.extend(cache_families(cache.cache_stats()))
        loading = self.backend.model_loading
        if loading is not None:
            families.extend(load_families(loading.load_stats()))
        yield from families


class Metrics:
    def __init__(self, backend: Backend) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("hearth_http_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.ttft = Histogram("hearth_time_to_first_token_seconds", "Request arrival to first token",
                              ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("hearth_inter_token_latency_seconds", "Time between streamed tokens",
                             ["endpoint"], buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("hearth_request_duration_seconds", "Generation request arrival to last event",
                             ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("hearth_queue_time_seconds", "Arrival to admission (a free slot)",
                               ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.embedded_inputs = Counter("hearth_embedding_inputs", "Inputs embedded, by endpoint", ["endpoint"],
                                       registry=r)
        self.embedded_tokens = Counter("hearth_embedding_tokens", "Tokens of the inputs embedded, by endpoint",
                                       ["endpoint"], registry=r)
        self.cancellations = Counter("hearth_cancellations", "Runs stopped early, by cause",
                                     ["cause"], registry=r)
        self.runs_registered = Gauge("hearth_cancel_registry_runs", "Runs registered for /v1/cancel",
                                     registry=r)
        self.cancels_pending = Gauge("hearth_cancel_registry_pending", "Early cancel_ids waiting for their run",
                                     registry=r)
        r.register(BackendCollector(backend))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def timer(self, endpoint: str, arrived: float) -> RequestTimer:
        return RequestTimer(self, endpoint, arrived)


class RequestTimer:
    """Observes one request's events: TTFT, inter-token latency, duration, timeouts."""

    def __init__(self, metrics: Metrics, endpoint: str, arrived: float) -> None:
        self.m, self.endpoint, self.arrived = metrics, endpoint, arrived
        self._itl = metrics.itl.labels(endpoint)  # per-token path: no label lookup per event
        self.first: float | None = None
        self.last: float | None = None
        self.admitted: float | None = None
        self.timed_out = False

    def admitted_now(self) -> None:
        self.admitted = time.monotonic()
        self.m.queue.labels(self.endpoint).observe(self.admitted - self.arrived)

    def __call__(self, ev: ChatEvent) -> None:
        now = time.monotonic()
        if isinstance(ev, TextDelta) and ev.n_tokens:
            if self.first is None:
                self.first = now
                self.m.ttft.labels(self.endpoint).observe(now - self.arrived)
            elif self.last is not None:
                self._itl.observe((now - self.last) / ev.n_tokens)
            self.last = now
        elif isinstance(ev, Finish) and ev.stop_reason == "timeout" and not self.timed_out:
            self.timed_out = True
            self.m.cancellations.labels("timeout").inc()

    def done(self, cancel_reason: str | None) -> None:
        self.m.e2e.labels(self.endpoint).observe(time.monotonic() - self.arrived)
        if cancel_reason is not None:
            self.m.cancellations.labels(cancel_reason).inc()
