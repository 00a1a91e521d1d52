"""Tenants: who owns what a node stores, and who may see it (docs/api.md, "Keys and tenants").

Every API key belongs to one tenant. A key file line is
`KEY [name=NAME] [tenant=TENANT] [cache=tenant|shared] [concurrent=N] [rpm=N] [tpm=N]
[role=client|gateway] [weight=W] [priority=CLASS] [max_priority=CLASS]` (concurrent, rpm, tpm:
the key's limits, hearth/http/key_usage.py; role: below; weight: its tenant's fair share of the
engine's work, default 1; priority: the class of its requests that name none, default
`default`; max_priority: the highest class its requests may ask for, default `default`, so a
key runs `priority` work only when its line says so; hearth/engine/fair_share.py): a named
key's tenant defaults to its name, so several keys share a tenant only when they say so; a
bare line (and `--api-key`) is a tenant of its own, named `key-` and the first 8 hex digits
of the key's SHA-256 (stable across restarts, and it does not reveal the key).
The key file is read again on SIGHUP and `POST /admin/keys/reload` (hearth/http/keyring.py).

Every session, snapshot and stored response records its owner (a tenant name) when created.
A caller sees an object when it owns it, or when it is the admin: the admin key, or anyone on a
node without keys (the local default, where nothing changes). The admin's own objects, and all
data stored before owners existed, have the owner `ADMIN` (the empty string, which no tenant
name can be), so they are the admin's alone.

The prompt cache is partitioned the same way (`Caller.namespace`): each tenant reuses only KV
its own requests left (in slots, sessions' swapped KV, the durable prompt cache), so how fast a
first token comes says nothing about other tenants' prompts. A key with `cache=shared` uses the
default namespace, the one the admin and a node without keys use: prefixes its requests leave
are reused by every caller in it (a system prompt all users send). A request's `cache_salt`
(vLLM's name) splits its caller's namespace further.

A gateway (docs/gateway.md, "Tenants through the gateway") calls a node with its own key and
says for which tenant in `X-Hearth-Tenant` (and `X-Hearth-Tenant-Cache: shared` for a
`cache=shared` key): the node believes that header only from a key whose line says
`role=gateway`, and then acts exactly as if the tenant's own key had called. From any other key
the header is refused (403): a client cannot claim another tenant, and a gateway whose key
lacks the role fails loudly instead of putting every tenant in one.

Session ids a tenant picks are its own namespace (`Caller.session_key`): on the node the
session is stored as `t<12 hex of the tenant's SHA-256>.<id>`, and the tenant sees and names it
by its own id (`Caller.shown`); the admin sees the stored id. So an id another tenant holds is
free for this one, exactly as an id nobody holds (no 409 says it is taken). Sessions stored
before this (a tenant's under its plain id) are still found by their plain id.

Invariant: a caller never learns that another tenant's object exists. Lookups that miss and
lookups of another tenant's id give the same 404 (the routes check `Caller.sees` before
anything else about the object).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

ADMIN = ""  # the owner of the admin's objects and of everything stored before owners
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")  # key and tenant names


CACHE_MODES = ("tenant", "shared")
ROLES = ("client", "gateway")  # a gateway key may speak for a tenant (TENANT_HEADER)
TENANT_HEADER = "x-hearth-tenant"  # the tenant a gateway's request is for
TENANT_CACHE_HEADER = "x-hearth-tenant-cache"  # "shared": that tenant's key says cache=shared
LIMITS = ("concurrent", "rpm", "tpm")  # requests at once, requests and tokens per minute
# Admission classes, lowest first (hearth.engine.fair_share.Priority has them as numbers).
CLASSES = ("flex", "default", "priority")
MAX_WEIGHT = 1000.0


@dataclass(frozen=True, slots=True)
class ApiKey:
    key: str
    name: str
    tenant: str
    cache: str = "tenant"  # the prompt-cache namespace: the tenant's own, or the shared one
    concurrent: int | None = None  # None: no limit
    rpm: int | None = None
    tpm: int | None = None
    role: str = "client"
    weight: float = 1.0  # the tenant's fair share (the last line of a tenant that says so wins)
    priority: str = "default"  # the class of a request that names none
    max_priority: str = "default"  # the highest class a request may ask for

    def __post_init__(self) -> None:
        if not (0.0 < self.weight <= MAX_WEIGHT):
            raise ValueError(f"key {self.name!r}: weight must be a number above 0 and at most {MAX_WEIGHT:g}")
        for what in ("priority", "max_priority"):
            if getattr(self, what) not in CLASSES:
                raise ValueError(f"key {self.name!r}: {what} must be one of {', '.join(CLASSES)}")
        if CLASSES.index(self.priority) > CLASSES.index(self.max_priority):
            raise ValueError(f"key {self.name!r}: priority may not be above max_priority")
        for limit in LIMITS:
            value = getattr(self, limit)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ValueError(f"key {self.name!r}: {limit} must be a whole number of at least 1")
        if self.cache not in CACHE_MODES:
            raise ValueError(f"key {self.name!r}: cache must be one of {', '.join(CACHE_MODES)}")
        if self.role not in ROLES:
            raise ValueError(f"key {self.name!r}: role must be one of {', '.join(ROLES)}")
        if not self.key.strip():
            raise ValueError("API keys must not be empty")
        for what, value in (("name", self.name), ("tenant", self.tenant)):
            if not NAME.fullmatch(value):
                raise ValueError(f"key {what} {value!r}: use 1-64 letters, digits, _ . @ -, starting with a letter "
                                 "or digit")


def bare_key(key: str) -> ApiKey:
    """A key given without a name: a tenant of its own, named after a hash of the key."""
    name = "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]
    return ApiKey(key, name, name)


def parse_key_line(line: str) -> ApiKey:
    """One line of a key file (not blank, not a comment). ValueError saying what is wrong."""
    key, *attrs = line.split()
    fields: dict[str, str] = {}
    for attr in attrs:
        name, eq, value = attr.partition("=")
        if not eq or not value or name not in (*_ATTRS, *LIMITS) or name in fields:
            raise ValueError(f"unknown, empty or repeated key attribute {name!r}: a line is KEY [name=NAME] "
                             "[tenant=TENANT] [cache=tenant|shared] [concurrent=N] [rpm=N] [tpm=N] "
                             "[role=client|gateway] [weight=W] [priority=CLASS] [max_priority=CLASS]")
        fields[name] = value
    limits: dict[str, int] = {}
    for limit in LIMITS:
        if limit in fields:
            if not fields[limit].isdigit():
                raise ValueError(f"{limit} must be a whole number of at least 1")
            limits[limit] = int(fields[limit])
    name = fields.get("name", bare_key(key).name)
    try:
        weight = float(fields.get("weight", "1"))
    except ValueError:
        raise ValueError("weight must be a number above 0") from None
    priority = fields.get("priority", "default")
    # a key whose default class is above `default` may ask for it: its ceiling follows
    ceiling = fields.get("max_priority", max(priority, "default", key=_class_rank))
    return ApiKey(key, name, fields.get("tenant", name), fields.get("cache", "tenant"),
                  concurrent=limits.get("concurrent"), rpm=limits.get("rpm"), tpm=limits.get("tpm"),
                  role=fields.get("role", "client"), weight=weight, priority=priority, max_priority=ceiling)


_ATTRS = ("name", "tenant", "cache", "role", "weight", "priority", "max_priority")


def _class_rank(name: str) -> int:
    return CLASSES.index(name) if name in CLASSES else -1


# What a request may name (OpenAI's service_tier values; Hearth's `priority` field takes the same).
CLASS_NAMES = {"flex": "flex", "default": "default", "auto": "default", "priority": "priority"}


def class_name(value: str) -> str:
    """The class a request names (`auto` is `default`); ValueError naming the accepted ones."""
    try:
        return CLASS_NAMES[value]
    except KeyError:
        raise ValueError(f"must be one of {', '.join(CLASS_NAMES)}") from None


def run_class(asked: str | None, default: str, ceiling: str) -> str:
    """The class a request runs in: what it asked for (else its key's default), never above
    its key's ceiling (as OpenAI serves a request for a tier it may not use in `default`)."""
    return min(asked if asked is not None else default, ceiling, key=_class_rank)


def read_key_file(path: str | Path) -> list[ApiKey]:
    """The keys of a key file: one per line; blank lines and lines starting with # are skipped.
    ValueError naming the file and the line that is wrong (a line that cannot be parsed, a key
    or a name given on an earlier line too), never the line itself: it holds a key."""
    out: list[ApiKey] = []
    seen_keys: dict[str, int] = {}
    seen_names: dict[str, int] = {}
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.strip()
        if line and not line.startswith("#"):
            try:
                k = parse_key_line(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: {e}") from None  # never echo the line: it holds a key
            if k.key in seen_keys:
                raise ValueError(f"{path}:{n}: the same API key is on line {seen_keys[k.key]}")
            if k.name in seen_names:
                raise ValueError(f"{path}:{n}: the key name {k.name!r} is on line {seen_names[k.name]} too")
            seen_keys[k.key], seen_names[k.name] = n, n
            out.append(k)
    return out


def check_keyring(keys: list[ApiKey]) -> None:
    """No key twice, no name twice: a name is what usage and logs report."""
    if len({k.key for k in keys}) != len(keys):
        raise ValueError("the same API key is given twice")
    names = [k.name for k in keys]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two API keys share the name {twice[0]!r}")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request, as the node's key check found it."""

    tenant: str  # the owner recorded on what it creates
    key_name: str | None = None  # None: the node has no keys
    admin: bool = False  # sees and manages every tenant's objects
    shared_cache: bool = False  # its key says cache=shared
    via_gateway: bool = False  # a gateway's key (`key_name`) spoke for the tenant (TENANT_HEADER)
    weight: float = 1.0  # its tenant's fair share of the engine's work
    priority: str = "default"  # the class of its requests that name none (CLASSES)
    max_priority: str = "default"  # the highest class it may ask for (the admin, a node without keys: any)

    @property
    def on_behalf(self) -> str | None:
        """The tenant a gateway's request is for (its usage is counted to it too); else None."""
        return self.tenant if self.via_gateway else None

    def sees(self, owner: str) -> bool:
        return self.admin or owner == self.tenant

    def namespace(self, salt: str | None = None) -> str:
        """The prompt-cache namespace of its requests: "" (the default, shared one) for the
        admin, a node without keys and `cache=shared` keys; else its tenant's own. A salt
        splits it further. Distinct inputs give distinct strings (NUL never is in a name)."""
        base = "" if self.admin or self.shared_cache else "tenant\0" + self.tenant
        return base if salt is None else base + "\0salt\0" + salt

    def session_key(self, sid: str) -> str:
        """The stored id of the session this caller names `sid`: itself for the admin (and a
        node without keys); within its tenant's namespace for a tenant (an id already in it
        stays as it is). Callers check the result is a session id (hearth.sessions.ids)."""
        if self.admin:
            return sid
        prefix = session_prefix(self.tenant)
        return sid if sid.startswith(prefix) else prefix + sid

    def shown(self, stored: str) -> str:
        """A stored session id as this caller names it: its own tenant's without the prefix."""
        if self.admin:
            return stored
        return stored.removeprefix(session_prefix(self.tenant))

    @property
    def scope(self) -> str | None:
        """The owner a listing or lookup is limited to; None: every owner (the admin)."""
        return None if self.admin else self.tenant


def session_prefix(tenant: str) -> str:
    """The prefix of a tenant's stored session ids: fixed length, in the session id alphabet,
    one per tenant (a tenant name may hold every character a session id may, so not the name)."""
    return "t" + hashlib.sha256(tenant.encode()).hexdigest()[:12] + "."


OPEN = Caller(ADMIN, None, admin=True, max_priority="priority")  # any request on a node without keys
ADMIN_CALLER = Caller(ADMIN, "admin", admin=True, max_priority="priority")  # the admin key



def tenant_headers(tenant: str, shared_cache: bool = False) -> dict[str, str]:
    """What a gateway sends a node (with its own `role=gateway` key) to act for `tenant`."""
    return {TENANT_HEADER: tenant, **({TENANT_CACHE_HEADER: "shared"} if shared_cache else {})}


# What a gateway says of the client key it forwards for (docs/gateway.md, "Tenants through the
# gateway"): `weight=W;priority=CLASS;max_priority=CLASS`, that key's line. A node believes it
# only from a `role=gateway` key and caps it by that key's own line (`gateway_class`), so a
# gateway can pass on its tenants' differences but never claim more than its node granted it.
TENANT_CLASS_HEADER = "x-hearth-tenant-class"
_CLASS_FIELDS = ("weight", "priority", "max_priority")


@dataclass(frozen=True, slots=True)
class TenantClass:
    weight: float = 1.0
    priority: str = "default"
    max_priority: str = "default"


def class_header(who: Caller) -> dict[str, str]:
    """The TENANT_CLASS_HEADER a gateway sends with `who`'s request (`who` is a tenant's key)."""
    return {TENANT_CLASS_HEADER: f"weight={who.weight:g};priority={who.priority};max_priority={who.max_priority}"}


def parse_class_header(value: str) -> TenantClass:
    """The fields of a TENANT_CLASS_HEADER; ValueError naming what is wrong. Every field is
    optional (a missing one is the key-file default); an unknown or repeated one is an error."""
    fields: dict[str, str] = {}
    for part in value.split(";"):
        part = part.strip()
        if not part:
            continue
        name, eq, val = part.partition("=")
        name, val = name.strip(), val.strip()
        if not eq or name not in _CLASS_FIELDS or name in fields:
            raise ValueError(f"{TENANT_CLASS_HEADER} takes weight=W;priority=CLASS;max_priority=CLASS, got {part!r}")
        fields[name] = val
    try:
        weight = float(fields.get("weight", "1"))
    except ValueError:
        raise ValueError(f"{TENANT_CLASS_HEADER}: weight must be a number") from None
    if not (0.0 < weight <= MAX_WEIGHT):  # also NaN
        raise ValueError(f"{TENANT_CLASS_HEADER}: weight must be above 0 and at most {MAX_WEIGHT:g}")
    priority, ceiling = fields.get("priority", "default"), fields.get("max_priority", "default")
    for what, name in (("priority", priority), ("max_priority", ceiling)):
        if name not in CLASSES:
            raise ValueError(f"{TENANT_CLASS_HEADER}: {what} must be one of {', '.join(CLASSES)}")
    return TenantClass(weight, priority, ceiling)


def gateway_class(claimed: TenantClass, gateway: ApiKey) -> TenantClass:
    """What a node grants a gateway's tenant: the class the gateway claims, capped by the
    gateway key's own line (its weight and max_priority are the ceiling of what it forwards);
    the default class never above the ceiling."""
    ceiling = min(claimed.max_priority, gateway.max_priority, key=_class_rank)
    return TenantClass(min(claimed.weight, gateway.weight), min(claimed.priority, ceiling, key=_class_rank), ceiling)
