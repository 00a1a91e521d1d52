"""Reading samples out of a Prometheus text exposition (what /metrics serves)."""

from __future__ import annotations

import re

_SELECTOR = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def sample(text: str, selector: str, default: float | None = None, **labels: str) -> float:
    """The sum of the samples of metric `selector` whose labels include every given one.

    `selector` is a name, optionally with labels in exposition syntax
    (`hearth_cancellations_total{cause="disconnect"}`); keyword `labels` add to them. A metric
    with no matching sample (a labelled counter is listed only from its first increment on)
    gives `default`, or KeyError when there is none."""
    m = _SELECTOR.match(selector)
    if m is None:
        raise ValueError(f"not a metric selector: {selector!r}")
    name, wanted = m.group(1), {**dict(_LABEL.findall(m.group(2) or "")), **labels}
    found, total = False, 0.0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        line_name, _, rest = head.partition("{")
        if line_name != name:
            continue
        have = dict(_LABEL.findall(rest))
        if all(have.get(k) == v for k, v in wanted.items()):
            found, total = True, total + float(value)
    if not found:
        if default is None:
            raise KeyError(selector)
        return default
    return total
