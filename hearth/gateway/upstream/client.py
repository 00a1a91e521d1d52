"""Where a node's endpoints are: the one place the gateway builds a node URL (the node's paths
themselves are in hearth.fleet_protocol where they are part of the node <-> gateway protocol)."""

from __future__ import annotations

from hearth.gateway.settings import Upstream


def node_url(up: Upstream, path: str) -> str:
    """`path` (with its query, if any) on the node `up` names."""
    return up.url + path
