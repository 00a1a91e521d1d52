"""The API keys in force, reloaded from the key file without a restart (docs/api.md, "Reloading
the keys"): on SIGHUP and `POST /admin/keys/reload`, on a node and on the gateway alike.

`LiveKeys.ring` is one immutable `Ring` (the keys, their values and names). A reload reads the
file, checks it whole, and only then replaces that one reference; the key check
(hearth/http/auth.py) reads the reference once per request, so a request sees the old ring or
the new one, never a mix. Everything that follows the keys (each key's usage and limits,
hearth/http/key_usage.py; the batch runners' "is the key still there") is told in the same
synchronous step (`on_swap`), with no await between the swap and them: nothing on the event loop
runs between. Requests already admitted finish as they are; the next request of a removed key is
a 401.

A key's identity across reloads is its name (what usage, limits, logs and batches name it by):
a line whose name is new is *added*, a name no longer in the file is *removed*, a name whose
line differs in anything (its key, tenant, limits, weight, classes, role, cache) is *changed*.
So a key rotated under its name keeps its usage, its limit windows and its batches; the old key
value gets 401 at once.

What never changes by a reload: the `--api-key` flags (they are not in the file: kept as they
are), the admin key, the metrics token and a gateway's join key (flags too; a restart changes
them), and whether keys are checked at all: a file that would leave a server that checks keys
with none (so open to anyone), or give keys to one that started with an empty file, is refused.

An invalid or unreadable file is an error that changes nothing (the old keys stay in force): a
`BadRequest` naming the file and the line, never a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hearth.errors import BadRequest
from hearth.tenants import ApiKey, bare_key, check_keyring, read_key_file

log = logging.getLogger("hearth.keys")


@dataclass(frozen=True, slots=True)
class Ring:
    """One generation of the keys: never changed, only replaced."""

    keys: tuple[ApiKey, ...] = ()
    values: tuple[str, ...] = ()  # each key's value, in order (for the constant-time comparisons)
    names: frozenset[str] = frozenset()

    @classmethod
    def of(cls, keys: Sequence[ApiKey]) -> Ring:
        return cls(tuple(keys), tuple(k.key for k in keys), frozenset(k.name for k in keys))


@dataclass(frozen=True, slots=True)
class KeyDiff:
    """What a reload changed, by key name (counts only leave this module: never a key)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: int

    def as_json(self) -> dict[str, Any]:
        return {"object": "keys.reload", "added": len(self.added), "removed": len(self.removed),
                "changed": len(self.changed), "unchanged": self.unchanged}


def diff(old: Sequence[ApiKey], new: Sequence[ApiKey]) -> KeyDiff:
    """Keys compared by name (the module's docstring says why)."""
    before = {k.name: k for k in old}
    after = {k.name: k for k in new}
    added = tuple(n for n in after if n not in before)
    removed = tuple(n for n in before if n not in after)
    changed = tuple(n for n in after if n in before and before[n] != after[n])
    return KeyDiff(added, removed, changed, len(after) - len(added) - len(changed))


class LiveKeys:
    """The keys a server checks, and the file they are reloaded from (None: nothing to reload)."""

    def __init__(self, keyring: Sequence[ApiKey], path: str | Path | None = None, fixed: Sequence[str] = ()) -> None:
        """`keyring`: every key at start (the flags' first, as Settings.keyring lists them);
        `fixed`: the `--api-key` flags' values, kept by every reload."""
        self.path = Path(path) if path is not None else None
        self._fixed = [bare_key(k) for k in dict.fromkeys(fixed) if k.strip()]
        self.ring = Ring.of(keyring)
        self._listeners: list[Callable[[Ring], None]] = []
        self.reloads = {"ok": 0, "refused": 0}  # /metrics (KeyReloadCollector)

    def on_swap(self, listener: Callable[[Ring], None]) -> None:
        """Call `listener(new_ring)` right after each swap (synchronously: it must not await)."""
        self._listeners.append(listener)

    def reload(self) -> dict[str, Any]:
        """Read the key file again and put it in force; what changed (counts). BadRequest when
        there is no file to reload or it cannot be used: then nothing changed."""
        if self.path is None:
            raise BadRequest("the server was started without --api-key-file: there are no keys to reload "
                             "(key checks are not turned on by a reload; restart with --api-key-file)",
                             code="no_key_file")
        try:
            named = read_key_file(self.path)
            keys = [*self._fixed, *named]
            check_keyring(keys)  # a flag's key in the file too
            file_keys = len(self.ring.keys) - len(self._fixed)
            if file_keys > 0 and not named:
                raise ValueError("it has no keys, and the server started with some: a reload does not turn key "
                                 "checks (or a gateway's tenants) off; restart the server for that")
            if file_keys == 0 and named:
                raise ValueError("the server started with no keys in it, so it checks none: restart it to turn "
                                 "key checks on")
        except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
            # what is wrong and where (the file, the line when it is one), never a key
            why = f"{e.strerror or e}: {self.path}" if isinstance(e, OSError) else str(e)
            why = why if why.startswith(str(self.path)) else f"{self.path}: {why}"
            log.error("API keys not reloaded, the keys in force are unchanged: %s", why)
            self.reloads["refused"] += 1
            raise BadRequest(f"key file not reloaded, the keys in force are unchanged: {why}",
                             code="invalid_key_file") from e
        return self.swap(keys)

    def swap(self, keys: Sequence[ApiKey]) -> dict[str, Any]:
        """Put `keys` in force at once (one reference replaced), tell the listeners, log it."""
        change = diff(self.ring.keys, keys)
        ring = Ring.of(keys)
        self.ring = ring
        self.reloads["ok"] += 1
        for listener in self._listeners:
            listener(ring)
        out = change.as_json()
        log.info("API keys reloaded: %d added, %d removed, %d changed, %d unchanged", out["added"], out["removed"],
                 out["changed"], out["unchanged"])
        return out


def reload_logged(live: LiveKeys) -> None:
    """`live.reload()` for SIGHUP: a file that cannot be used was logged and changed nothing."""
    with contextlib.suppress(BadRequest):  # reload logged why; the keys in force stay
        live.reload()


def on_sighup(actions: Sequence[Callable[[], None]]) -> bool:
    """Run each of `actions` on SIGHUP, each on its own (one that raises is logged and does not
    stop the next: the gateway's fleet file and key file reload independently). False where
    signals cannot be handled here (not the main thread: a test's in-process server) or there is
    nothing to do; `off_sighup` undoes it."""
    if not actions:
        return False

    def fire() -> None:
        for act in actions:
            try:
                act()
            except Exception as e:  # a reload's failure must not stop the others
                log.error("SIGHUP: %s", e)

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, fire)
    except (ValueError, RuntimeError, NotImplementedError):
        return False
    return True


def off_sighup() -> None:
    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)


class KeyReloadCollector(Collector):
    """On /metrics: the keys in force (a count) and the reloads, applied or refused."""

    def __init__(self, live: LiveKeys) -> None:
        self.live = live

    def collect(self) -> Iterator[Metric]:
        keys = GaugeMetricFamily("hearth_api_keys", "API keys in force (the key file's and the flags')")
        keys.add_metric([], len(self.live.ring.keys))
        yield keys
        reloads = CounterMetricFamily("hearth_key_reloads", "Reloads of the key file (SIGHUP, POST "
                                      "/admin/keys/reload): ok, or refused (the keys in force unchanged)",
                                      labels=["result"])
        for result, n in self.live.reloads.items():
            reloads.add_metric([result], n)
        yield reloads
