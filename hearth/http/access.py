"""Who may call, as the HTTP edge needs it: the one access-settings type both products hand to
`hearth.http.app.assemble`. A node reads it from its `hearth.config.Settings`, the gateway from
its `GatewaySettings`; both have these fields, so neither builds the other's settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hearth.http.keyring import LiveKeys
from hearth.tenants import ApiKey


class HasAccess(Protocol):
    """The fields a product's settings carry for the edge (both settings types have them)."""

    @property
    def keyring(self) -> list[ApiKey]: ...
    @property
    def admin_key(self) -> str | None: ...
    @property
    def metrics_token(self) -> str | None: ...
    @property
    def metrics_public(self) -> bool: ...
    @property
    def cors_origins(self) -> list[str]: ...


@dataclass(frozen=True)
class AccessSettings:
    keyring: tuple[ApiKey, ...] = ()  # every client key with its name and tenant
    admin_key: str | None = None
    metrics_token: str | None = None
    metrics_public: bool = False  # /metrics without a token
    cors_origins: tuple[str, ...] = ()
    join_key: str | None = None  # a gateway's fleet join key (None on a node)
    # The keys in force when they can be reloaded (hearth/http/keyring.py); None: `keyring`, fixed.
    live: LiveKeys | None = None

    @classmethod
    def of(cls, settings: HasAccess, join_key: str | None = None, live: LiveKeys | None = None) -> AccessSettings:
        return cls(tuple(settings.keyring), settings.admin_key, settings.metrics_token, settings.metrics_public,
                   tuple(settings.cors_origins), join_key, live)

    def keys(self) -> LiveKeys:
        """The keys the key check reads: `live`, else a ring of `keyring` nothing reloads."""
        return self.live if self.live is not None else LiveKeys(self.keyring)
