"""Prometheus metrics. Engine counters are read at scrape time (nothing on the hot path);
request latencies are observed per request by a `RequestTimer` on its event stream."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hearth.backends.local import LocalBackend
from hearth.chat.types import ChatEvent, Finish, TextDelta

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class EngineCollector(Collector):
    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily("hearth_running_sequences", "Requests decoding or prefilling", labels=["model"])
        waiting = GaugeMetricFamily("hearth_waiting_requests", "Requests queued for a slot", labels=["model"])
        kv = GaugeMetricFamily("hearth_kv_tokens", "Tokens held in the KV cache (all slots)", labels=["model"])
        kv_use = GaugeMetricFamily("hearth_kv_slots_busy", "KV sequence slots in use", labels=["model"])
        swapped = GaugeMetricFamily("hearth_swapped_kv_ram_bytes", "Swapped-out session KV held in RAM",
                                    labels=["model"])
        counters = {
            name: CounterMetricFamily(f"hearth_{name}", doc, labels=["model"])
            for name, doc in (("prompt_tokens", "Prompt tokens prefilled"),
                              ("cached_tokens", "Prompt tokens reused from the KV cache"),
                              ("generated_tokens", "Tokens generated"),
                              ("engine_steps", "Engine steps (one llama_decode each)"),
                              ("requests_finished", "Requests finished, any reason"),
                              ("requests_cancelled", "Requests cancelled in the engine"),
                              ("kv_swap_outs", "Session KV swapped out of a slot"),
                              ("kv_swap_ins", "Session KV swapped back into a slot"),
                              ("spec_drafted_tokens", "Speculative (prompt-lookup) draft tokens verified"),
                              ("spec_accepted_tokens", "Draft tokens accepted (emitted without a step of their own)"),
                              ("interrupted_decodes", "Decodes stopped midway by an abort (neighbours re-run)"))
        }
        load = self.backend.load()
        for mid, e in self.backend.engines().items():
            n_running, n_waiting = load.get(mid, (0, 0))
            running.add_metric([mid], n_running)
            waiting.add_metric([mid], n_waiting)
            kv.add_metric([mid], e.slots.kv_tokens)
            kv_use.add_metric([mid], e.slots.n_busy)
            swapped.add_metric([mid], e.swap.ram_bytes())
            s = e.stats
            for name, value in (("prompt_tokens", s.prompt_tokens), ("cached_tokens", s.cached_tokens),
                                ("generated_tokens", s.generated_tokens), ("engine_steps", s.steps),
                                ("requests_finished", s.finished), ("requests_cancelled", s.cancelled),
                                ("kv_swap_outs", s.swap_outs), ("kv_swap_ins", s.swap_ins),
                                ("spec_drafted_tokens", s.drafted_tokens), ("spec_accepted_tokens", s.accepted_tokens),
                                ("interrupted_decodes", s.interrupted_decodes)):
                counters[name].add_metric([mid], value)
        yield from (running, waiting, kv, kv_use, swapped)
        yield from counters.values()


class Metrics:
    def __init__(self, backend: LocalBackend) -> None:
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
        self.cancellations = Counter("hearth_cancellations", "Runs stopped early, by cause",
                                     ["cause"], registry=r)
        self.runs_registered = Gauge("hearth_cancel_registry_runs", "Runs registered for /v1/cancel",
                                     registry=r)
        self.cancels_pending = Gauge("hearth_cancel_registry_pending", "Early cancel_ids waiting for their run",
                                     registry=r)
        r.register(EngineCollector(backend))

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
