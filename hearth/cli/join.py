"""`hearth serve --join GATEWAY_URL`: the node side of a fleet that changes while it serves
(the gateway side: gateway/fleet/membership.py).

A thread beside the server registers the node with the gateway (`POST /admin/fleet/join`, with
the join key) and renews the registration as often as the gateway asks (`renew_every`, a third
of its registration's lifetime), retrying every few seconds while the gateway cannot be reached.
A clean shutdown leaves the fleet (`DELETE /admin/fleet/NAME`); a node killed or stopped simply
stops renewing, and the gateway takes it out of routing when its registration lapses.

The join key and the node's own keys travel only in the request (the keys are what the gateway
calls this node with); none of them is ever logged.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from typing import Any
from urllib.parse import quote

import httpx

log = logging.getLogger("hearth.join")

NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # as the gateway's upstream names (gateway/settings.py)
RETRY = 2.0  # seconds between tries while the gateway cannot be reached or refuses
TIMEOUT = 5.0


def node_name(name: str | None) -> str:
    """The name the node joins under: --node-name, else the host name (a StatefulSet pod's is
    stable: hearth-0, hearth-1…)."""
    name = name or socket.gethostname().split(".")[0]
    if not NAME.match(name):
        raise ValueError(f"node name {name!r} must match {NAME.pattern} (set --node-name)")
    return name


def advertise_url(url: str | None, host: str, port: int) -> str:
    """The URL the gateway reaches this node at: --advertise-url, else --host and --port (the
    host name in place of an address that binds every interface)."""
    if url is None:
        shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
        shown = f"[{shown}]" if ":" in shown else shown
        url = f"http://{shown}:{port}"
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--advertise-url {url!r} must start with http:// or https://")
    return url.rstrip("/")


class Joiner:
    def __init__(self, gateway: str, key: str | None, name: str, url: str, spec: dict[str, Any],
                 transport: httpx.BaseTransport | None = None) -> None:
        if not gateway.startswith(("http://", "https://")):
            raise ValueError(f"--join {gateway!r} must be the gateway's URL (http:// or https://)")
        self.name = name
        self.body = {"name": name, "url": url, **spec}
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(base_url=gateway.rstrip("/"), headers=headers, timeout=TIMEOUT,
                                    transport=transport)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hearth-join", daemon=True)
        self.joined = threading.Event()  # set once the gateway took a registration
        self._state = ""  # the last outcome logged: a line per change, not per renewal

    def start(self) -> None:
        self._thread.start()

    def renew(self) -> float:
        """One registration; the seconds until the next one."""
        try:
            r = self._client.post("/admin/fleet/join", json=self.body)
        except httpx.HTTPError as e:
            self._note("unreachable", logging.WARNING, "gateway %s unreachable (%s); retrying", self._client.base_url,
                       type(e).__name__)
            return RETRY
        if r.status_code != 200:
            self._note(f"refused {r.status_code}", logging.ERROR, "gateway %s refused the registration of %s: %s %s",
                       self._client.base_url, self.name, r.status_code, _message(r))
            return RETRY
        self.joined.set()
        self._note("joined", logging.INFO, "joined the fleet of %s as %s (%s)", self._client.base_url, self.name,
                   self.body["url"])
        every = r.json().get("renew_every")
        return float(every) if isinstance(every, (int, float)) and every > 0 else RETRY

    def leave(self) -> None:
        try:
            r = self._client.delete(f"/admin/fleet/{quote(self.name, safe='')}")
            if r.status_code in (200, 404):
                log.info("left the fleet of %s", self._client.base_url)
            else:
                log.warning("leaving the fleet of %s: %s %s", self._client.base_url, r.status_code, _message(r))
        except httpx.HTTPError as e:
            log.warning("leaving the fleet of %s failed (%s)", self._client.base_url, type(e).__name__)

    def _note(self, state: str, level: int, msg: str, *args: object) -> None:
        if state != self._state:
            self._state = state
            log.log(level, msg, *args)

    def _run(self) -> None:
        wait = 0.0
        while not self._stop.wait(wait):
            wait = self.renew()
        if self.joined.is_set():
            self.leave()
        self._client.close()

    def stop(self, timeout: float = TIMEOUT + 1) -> None:
        """Stop renewing and leave the fleet (once the thread ends: at most `timeout` seconds)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)


def _message(r: httpx.Response) -> str:
    try:
        err = r.json().get("error")
        return str(err.get("message")) if isinstance(err, dict) else r.text[:200]
    except ValueError:
        return r.text[:200]
