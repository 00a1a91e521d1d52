"""Gateway settings: flags and HEARTH_* env like `serve`, plus the upstream list from a TOML
file:

    [[upstream]]
    name = "a"
    url = "http://10.0.0.5:8000"
    kind = "hearth"            # hearth | openai
    api_key = "node-key"       # sent to the upstream; never the client's
    admin_key = "node-admin"   # for session moves (DELETE on the node); default: api_key
    models = { "smol" = "smollm2-135m-instruct" }   # alias -> the upstream's model id
    max_in_flight = 8
    stall_timeout = 30         # seconds a stream may send nothing; 0: never (default: --stall-timeout
                               # for hearth upstreams, never for openai ones)
    continuation = "vllm"      # openai upstreams: how this engine continues a partial answer sent
                               # to it (vllm | prefill | none; default none), failover/openai.py
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hearth.config import LOOPBACK, check_access, check_origins, default_data_dir
from hearth.tenants import ApiKey, bare_key, check_keyring

KINDS = ("hearth", "openai")
# How an openai-kind engine continues a final assistant message (failover/openai.py): vLLM's and
# SGLang's `continue_final_message`, llama-server's assistant prefill, or not at all.
CONTINUATIONS = ("none", "vllm", "prefill")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Upstream:
    name: str
    url: str
    kind: str = "hearth"
    api_key: str | None = None
    admin_key: str | None = None
    models: dict[str, str] = field(default_factory=dict)  # alias -> upstream model id
    max_in_flight: int = 8
    stall_timeout: float | None = None  # None: the gateway's default for the kind; 0: never
    continuation: str = "none"  # openai kind: how the engine continues a partial answer (CONTINUATIONS)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"upstream name {self.name!r} must match {_NAME.pattern}")
        if self.kind not in KINDS:
            raise ValueError(f"upstream {self.name}: kind must be one of {', '.join(KINDS)}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"upstream {self.name}: url must start with http:// or https://")
        if not self.models:
            raise ValueError(f"upstream {self.name}: models (alias = \"model id\") must name at least one model")
        if self.max_in_flight < 1:
            raise ValueError(f"upstream {self.name}: max_in_flight must be at least 1")
        if self.stall_timeout is not None and not self.stall_timeout >= 0:
            raise ValueError(f"upstream {self.name}: stall_timeout must be >= 0 seconds (0: never)")
        if self.continuation not in CONTINUATIONS:
            raise ValueError(f"upstream {self.name}: continuation must be one of {', '.join(CONTINUATIONS)}")
        if self.continuation != "none" and self.kind != "openai":  # Hearth nodes continue by themselves
            raise ValueError(f"upstream {self.name}: continuation is for openai upstreams (Hearth nodes always "
                             "continue a partial answer)")
        object.__setattr__(self, "url", self.url.rstrip("/"))

    def headers(self, admin: bool = False) -> dict[str, str]:
        key = (self.admin_key or self.api_key) if admin else self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass(slots=True)
class GatewaySettings:
    upstreams: list[Upstream]
    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: Path = field(default_factory=lambda: default_data_dir() / "gateway")
    # The shared state (store/base.py): None, SQLite under data_dir (one gateway); a
    # postgresql:// URL, PostgreSQL (any number of gateways). Not in the repr: it may hold a password.
    database: str | None = field(default=None, repr=False)
    lease_ttl: float = 15.0  # seconds a gateway's lease outlives its last renewal (leases.py)
    # Batch API lines the gateway runs at once, all batches together (batches/runner.py): spread
    # over the nodes by routing; each node admits them as `flex`, after interactive work
    batch_concurrency: int = 4
    default_model: str | None = None  # an alias: what unknown model names are served by
    api_keys: list[str] = field(default_factory=list)  # bare keys (--api-key): each a tenant of its own
    named_keys: list[ApiKey] = field(default_factory=list)  # --api-key-file, a node's format (hearth.tenants)
    api_key_file: Path | None = None  # where named_keys came from: reloaded on SIGHUP (hearth/http/keyring.py)
    admin_key: str | None = None
    metrics_token: str | None = None
    metrics_public: bool = False
    insecure: bool = False
    cors_origins: list[str] = field(default_factory=lambda: [LOOPBACK])  # as a node's (hearth/http/cors.py)
    max_waiting: int = 64  # the one wait queue for a free node
    max_wait: float = 30.0
    probe_interval: float = 2.0  # liveness probes, seconds
    probe_timeout: float = 2.0
    connect_timeout: float = 3.0
    heartbeat: float = 5.0  # SSE comment while an upstream has not sent its first byte
    # A stream from a Hearth node that sends nothing this long is broken (0: never). Hearth nodes
    # beat every --sse-heartbeat seconds (5) while a stream is silent, so silence means a stopped
    # or wedged node; engines of the openai kind may say nothing during a long prefill: never by default.
    stall_timeout: float = 30.0
    # Times one stream may continue on another node after its node died mid-answer
    # (failover/cuts/), or on another openai upstream that can continue it (failover/openai.py); 0: never,
    # the client gets the terminal error.
    migration_limit: int = 3
    log_level: str = "info"
    routing: str = "cost"  # cost | round_robin (a baseline for benchmarks)
    # Routing on what Hearth nodes hold (digests.py): seconds between digest reads (0: off),
    # the bound on a read or a request's blocks call, and how long a digest whose reads fail is
    # still used (marked stale) before the node is routed by the estimate.
    digest_interval: float = 1.0
    digest_timeout: float = 1.0
    digest_max_age: float = 5.0
    # The fleet can change while the gateway serves (membership.py): the TOML file it was started
    # with (None: none; reloaded on SIGHUP or POST /admin/fleet/reload), the key nodes join with
    # (`hearth serve --join`; the admin key is accepted too), how long a registration lasts
    # without renewal (nodes renew every third of it), and how long a lapsed node is kept out of
    # routing before it is removed.
    upstreams_file: Path | None = None
    join_key: str | None = None
    member_ttl: float = 15.0
    member_grace: float = 60.0
    # Observability (docs/gateway.md, "Usage ledger and traces"): one row per turn in the store,
    # and OTLP/HTTP traces continued from the client and propagated to the nodes (None: off,
    # unless OTEL_EXPORTER_OTLP_* names an endpoint).
    usage_ledger: bool = True
    otlp_endpoint: str | None = None

    def __post_init__(self) -> None:
        check_fleet(self.upstreams)
        if self.max_waiting < 0 or self.max_wait <= 0:
            raise ValueError("--max-waiting must be >= 0 and --max-wait > 0")
        if self.database is not None and not self.database.startswith(("postgresql://", "postgres://")):
            raise ValueError("--database must be a postgresql:// URL (without it: SQLite under the data dir)")
        if not self.lease_ttl > 0:
            raise ValueError("--lease-ttl must be > 0 seconds")
        if self.routing not in ("cost", "round_robin"):
            raise ValueError("--routing must be cost or round_robin")
        if self.migration_limit < 0:
            raise ValueError("--migration-limit must be >= 0")
        if not self.stall_timeout >= 0:
            raise ValueError("--stall-timeout must be >= 0 seconds (0: never)")
        if self.probe_interval <= 0 or self.probe_timeout <= 0:
            raise ValueError("--probe-interval and --probe-timeout must be > 0")
        if not self.digest_interval >= 0 or not self.digest_timeout > 0 or not self.digest_max_age > 0:
            raise ValueError("--digest-interval must be >= 0 (0: off), --digest-timeout and --digest-max-age > 0")
        if not self.member_ttl > 0 or not self.member_grace >= 0:
            raise ValueError("--member-ttl must be > 0 and --member-grace >= 0 seconds")
        if self.join_key is not None and not self.join_key:
            raise ValueError("--join-key must not be empty")
        check_access(self.host, [*self.api_keys, *(k.key for k in self.named_keys)], self.insecure,
                     "--api-key (or --api-key-file)")
        check_keyring(self.keyring)
        check_origins(self.cors_origins)
        if self.upstreams and self.default_model is not None and self.default_model not in self.aliases():
            raise ValueError(f"--default-model {self.default_model!r} is not an alias of any upstream")

    @property
    def tenants(self) -> bool:
        """Whether the gateway carries its clients' tenants to the nodes and scopes its own
        records by them (tenancy.py): with a key file. Without one it is one tenant, as before."""
        return bool(self.named_keys)

    @property
    def keyring(self) -> list[ApiKey]:
        """Every client key with its name and tenant, as a node's (`hearth.config.Settings.keyring`)."""
        return [*(bare_key(k) for k in dict.fromkeys(self.api_keys) if k.strip()), *self.named_keys]

    def aliases(self) -> dict[str, list[Upstream]]:
        """alias -> the upstreams that serve it (in config order, joined nodes after)."""
        return aliases_of(self.upstreams)

    def stall_timeout_for(self, up: Upstream) -> float | None:
        """Seconds a stream from `up` may send nothing before it counts as broken; None: no limit."""
        seconds = up.stall_timeout if up.stall_timeout is not None else (
            self.stall_timeout if up.kind == "hearth" else 0.0)
        return seconds or None

    def upstream(self, name: str) -> Upstream | None:
        return next((u for u in self.upstreams if u.name == name), None)


def aliases_of(upstreams: list[Upstream]) -> dict[str, list[Upstream]]:
    out: dict[str, list[Upstream]] = {}
    for u in upstreams:
        for alias in u.models:
            out.setdefault(alias, []).append(u)
    return out


def check_fleet(upstreams: list[Upstream]) -> None:
    """What every fleet must be, at start, after a reload and after a node joins: unique
    names, and each alias served by upstreams of one kind."""
    names = [u.name for u in upstreams]
    if len(set(names)) != len(names):
        raise ValueError(f"two upstreams share a name: {names}")
    for alias, ups in aliases_of(upstreams).items():
        if len({u.kind for u in ups}) > 1:  # why: docs/gateway.md, "Protocols at the edge"
            raise ValueError(f"alias {alias!r} is served by both hearth and openai upstreams "
                             f"({', '.join(u.name for u in ups)}): an alias needs upstreams of one kind")


def parse_upstreams(doc: dict[str, Any]) -> list[Upstream]:
    items = doc.get("upstream", [])
    if not isinstance(items, list):
        raise ValueError("upstreams: [[upstream]] tables expected")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"upstream #{i + 1}: a table expected")
        unknown = set(item) - {"name", "url", "kind", "api_key", "admin_key", "models", "max_in_flight",
                                "stall_timeout", "continuation"}
        if unknown:
            raise ValueError(f"upstream #{i + 1}: unknown keys {sorted(unknown)}")
        models = item.get("models", {})
        if isinstance(models, list):  # a plain list: each model under its own name
            models = {m: m for m in models}
        if not isinstance(models, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in models.items()):
            raise ValueError(f"upstream #{i + 1}: models must map alias = \"upstream model id\"")
        try:
            out.append(Upstream(name=str(item["name"]), url=str(item["url"]), kind=str(item.get("kind", "hearth")),
                                api_key=item.get("api_key"), admin_key=item.get("admin_key"), models=dict(models),
                                max_in_flight=int(item.get("max_in_flight", 8)),
                                stall_timeout=float(item["stall_timeout"]) if "stall_timeout" in item else None,
                                continuation=str(item.get("continuation", "none"))))
        except KeyError as e:
            raise ValueError(f"upstream #{i + 1}: {e.args[0]} is required") from e
    return out


def load_upstreams(path: Path) -> list[Upstream]:
    """The upstreams of a fleet file; ValueError (naming the file) if it cannot be read or is not
    a valid fleet."""
    try:
        with path.open("rb") as f:
            upstreams = parse_upstreams(tomllib.load(f))
        check_fleet(upstreams)
    except (OSError, tomllib.TOMLDecodeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from e
    return upstreams
