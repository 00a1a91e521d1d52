"""API keys: `Authorization: Bearer KEY` or `x-api-key: KEY`, compared in constant time.

- no keys configured: everything is open (the default bind is loopback);
- keys configured: every endpoint but /health and the chat page (/ and /web/*) needs one of them;
- an admin key, when configured, is accepted wherever an API key is (/metrics too) and is the
  only key for destructive operations: every DELETE (sessions, snapshots, stored responses,
  the prompt cache), a snapshot load with `force: true` (it replaces a session; checked by the
  handler, which sees the body); and for every path under /admin/ (the node's prompt cache, the
  gateway's fleet), which shows what other clients' requests left behind;
- /metrics needs the metrics token (or an API key) unless it was made public;
- a gateway's join key (`join_key`; None on a node) is accepted for what a node does to its own
  membership and nothing else: joining (POST /admin/fleet/join), leaving (DELETE
  /admin/fleet/NODE) and draining itself (POST /admin/nodes/NODE/drain). The handlers check
  again which node the key may touch.

Which key matched decides the request's `Caller` (hearth.tenants): its tenant, or the admin.
A key whose line says `role=gateway` may name the tenant it calls for in `X-Hearth-Tenant`
(the caller is then that tenant, `via_gateway`), and in `X-Hearth-Tenant-Class` that tenant's
key's weight and classes (capped by the gateway key's own line: hearth.tenants.gateway_class);
the header from any other key, or not a tenant name, is refused with 403 / 400 before anything
runs (a node without keys ignores them: nothing is scoped there).
The middleware records it in the ASGI scope; handlers read it with `caller(request)`. A node
without keys makes every request the admin's (`OPEN`): nothing is scoped.

The keys are reloadable (hearth/http/keyring.py): each request reads the ring in force once and
decides everything (which key, its caller, its class) from that one ring.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import replace

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from hearth.errors import BadRequest, Forbidden, HearthError, Unauthorized
from hearth.http.access import AccessSettings
from hearth.http.errors import ApiError, respond
from hearth.http.keyring import Ring
from hearth.tenants import (
    ADMIN_CALLER,
    NAME,
    OPEN,
    TENANT_CACHE_HEADER,
    TENANT_CLASS_HEADER,
    TENANT_HEADER,
    ApiKey,
    Caller,
    TenantClass,
    gateway_class,
    parse_class_header,
)

OPEN_PATHS = ("/health", "/", "/openapi.json")  # the API document holds no data
OPEN_PREFIXES = ("/web/",)  # the chat page's static files: they hold no data
ADMIN_PREFIX = "/admin/"  # every path under it needs the admin key (when one is set)
CALLER = "hearth.caller"  # the scope key the middleware records the caller under
# The scope key of a request the node makes to itself (a batch's lines, http/batches/dispatch.py):
# the caller it runs as, recorded when the batch was created with a checked key. Only code in
# this process builds such a scope; an HTTP server never puts this key in one.
INPROCESS_CALLER = "hearth.inprocess_caller"
FLEET_PREFIX = "/admin/fleet/"
# Under /admin/, readable by any key: the handlers scope them to the caller's tenant.
TENANT_READABLE = ("/admin/usage",)
TENANT_READABLE_PREFIXES = ("/admin/journal/",)


def join_path(method: str, path: str) -> bool:
    """A request a node makes about its own membership of a gateway's fleet."""
    if method == "POST" and path == FLEET_PREFIX + "join":
        return True
    if method == "DELETE" and path.startswith(FLEET_PREFIX):
        return "/" not in path[len(FLEET_PREFIX):]
    parts = path.split("/")  # "", "admin", "nodes", NODE, "drain"
    return method == "POST" and len(parts) == 5 and parts[1:3] == ["admin", "nodes"] and parts[4] == "drain"


def presented_key(headers: dict[bytes, bytes]) -> str | None:
    auth = headers.get(b"authorization", b"").decode("latin-1")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    key = headers.get(b"x-api-key")
    return key.decode("latin-1").strip() if key is not None else None


def matches(key: str | None, allowed: list[str]) -> bool:
    if key is None:
        return False
    found = False
    for k in allowed:  # compare against every key: the time taken says nothing about which matched
        found |= hmac.compare_digest(key.encode(), k.encode())
    return found


def which(key: str | None, keyring: Sequence[ApiKey]) -> ApiKey | None:
    """The entry of `keyring` that `key` is; every entry is compared, so the time taken says
    nothing about which matched (or whether one did)."""
    if key is None:
        return None
    found = None
    for k in keyring:
        if hmac.compare_digest(key.encode(), k.key.encode()):
            found = k
    return found


def caller(request: Request) -> Caller:
    """Who sent `request`, as the key check found it (OPEN on a node without keys)."""
    found = request.scope.get(CALLER)
    return found if isinstance(found, Caller) else OPEN


def require_admin(request: Request, admin: str | None) -> None:
    """For a destructive operation the middleware cannot see (it depends on the body): the
    request must present `admin`, the server's admin key, if it has one."""
    if admin and not matches(presented_key({k.lower(): v for k, v in request.headers.raw}), [admin]):
        raise Forbidden("this operation needs the admin key")


class AuthMiddleware:
    def __init__(self, app: ASGIApp, access: AccessSettings) -> None:
        self.app = app
        self.join_key = access.join_key
        self.live = access.keys()  # its `ring` may be replaced at any time: read it once per request
        self.admin_key = access.admin_key
        self.metrics_token = access.metrics_token
        self.metrics_public = access.metrics_public

    def _verdict(self, method: str, path: str, key: str | None, ring: Ring | None = None) -> HearthError | None:
        keys = list((ring or self.live.ring).values)
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or method == "OPTIONS":
            return None
        if path == "/metrics":
            if self.metrics_public:
                return None
            allowed = keys + [k for k in (self.metrics_token, self.admin_key) if k]
            if allowed and not matches(key, allowed):
                return Unauthorized("a valid metrics token or API key is required for /metrics")
            return None
        if self.join_key and join_path(method, path) and matches(key, [self.join_key]):
            return None
        if keys and not matches(key, keys + ([self.admin_key] if self.admin_key else [])):
            return Unauthorized("missing API key: send Authorization: Bearer KEY or x-api-key: KEY" if key is None
                                else "invalid API key")
        # every DELETE is destructive; /admin/ shows other clients' state (docs/api.md)
        scoped = method == "GET" and (path in TENANT_READABLE or path.startswith(TENANT_READABLE_PREFIXES))
        needs_admin = method == "DELETE" or (path.startswith(ADMIN_PREFIX) and not scoped)
        if needs_admin and self.admin_key and not matches(key, [self.admin_key]):
            return Forbidden("this operation needs the admin key")
        return None

    def _caller(self, key: str | None, headers: dict[bytes, bytes] | None = None,
                given: object = None, ring: Ring | None = None) -> Caller | HearthError:
        ring = ring or self.live.ring
        if not ring.keys:
            # An app without keys inside the gateway (its translating layer, gateway/edge/delegate.py)
            # acts for the caller the gateway found; a server's scope never holds one.
            return given if isinstance(given, Caller) else OPEN
        headers = headers or {}
        claimed = headers.get(TENANT_HEADER.encode())
        found = which(key, ring.keys)
        if claimed is not None or TENANT_CLASS_HEADER.encode() in headers:
            if found is None or found.role != "gateway":  # the admin key included: it is no gateway's
                return Forbidden(f"{TENANT_HEADER} and {TENANT_CLASS_HEADER} are accepted only from a gateway's key "
                                 "(role=gateway)")
            tenant = (claimed or b"").decode("latin-1").strip()
            if not NAME.fullmatch(tenant):
                return BadRequest(f"{TENANT_HEADER} must be a tenant name")
            shared = headers.get(TENANT_CACHE_HEADER.encode(), b"").strip().lower() == b"shared"
            # the client key's class as the gateway says it, capped by the gateway key's line;
            # without the header, the gateway key's own line (a gateway before it existed)
            said = headers.get(TENANT_CLASS_HEADER.encode())
            try:
                cls = gateway_class(parse_class_header(said.decode("latin-1")) if said is not None
                                    else TenantClass(found.weight, found.priority, found.max_priority), found)
            except ValueError as e:
                return BadRequest(str(e))
            return Caller(tenant, found.name, shared_cache=shared, via_gateway=True, weight=cls.weight,
                          priority=cls.priority, max_priority=cls.max_priority)
        if self.admin_key and matches(key, [self.admin_key]):
            return ADMIN_CALLER
        # No key matched: an open path (/health, the page) or /metrics by its token; nothing
        # there reads a caller, and an unknown tenant sees nothing should one ever do.
        if found is None:
            return Caller("\0none", None)
        return Caller(found.tenant, found.name, shared_cache=found.cache == "shared", weight=found.weight,
                      priority=found.priority, max_priority=found.max_priority)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        inprocess = scope.get(INPROCESS_CALLER)
        if isinstance(inprocess, Caller):
            scope[CALLER] = inprocess  # checked when its batch was created; key limits still apply
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        key = presented_key(headers)
        ring = self.live.ring  # one ring for the whole check: the old one or a reload's, never a mix
        verdict = self._verdict(scope["method"], scope["path"], key, ring)
        if verdict is None:
            who = self._caller(key, headers, scope.get(CALLER), ring)
            if isinstance(who, Caller):
                scope[CALLER] = who
                await self.app(scope, receive, send)
                return
            verdict = who
        err = ApiError.of(verdict)
        if isinstance(verdict, Unauthorized):
            err = replace(err, headers={"WWW-Authenticate": "Bearer"})
        await respond(scope["path"], err)(scope, receive, send)
