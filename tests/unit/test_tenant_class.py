"""The class a gateway forwards for its client's key (hearth.tenants, TENANT_CLASS_HEADER): the
header's parsing (every field checked, a clear error naming it) and the ceilings a node applies
(the gateway key's own line caps the weight and the classes it may claim)."""

from __future__ import annotations

import pytest

from hearth.tenants import (
    TENANT_CLASS_HEADER,
    ApiKey,
    Caller,
    TenantClass,
    class_header,
    gateway_class,
    parse_class_header,
)


def test_the_header_round_trips_a_callers_class() -> None:
    who = Caller("team-a", "alice", weight=2.5, priority="flex", max_priority="priority")
    (name, value), = class_header(who).items()
    assert name == TENANT_CLASS_HEADER
    assert parse_class_header(value) == TenantClass(2.5, "flex", "priority")


def test_missing_fields_are_the_key_file_defaults() -> None:
    assert parse_class_header("") == TenantClass(1.0, "default", "default")
    assert parse_class_header(" weight = 3 ; ") == TenantClass(3.0, "default", "default")
    assert parse_class_header("max_priority=priority") == TenantClass(1.0, "default", "priority")


@pytest.mark.parametrize(("value", "names"), [
    ("weight=0", "weight"), ("weight=-1", "weight"), ("weight=nan", "weight"), ("weight=inf", "weight"),
    ("weight=1001", "weight"), ("weight=x", "weight"), ("priority=urgent", "priority"),
    ("max_priority=high", "max_priority"), ("colour=red", "weight=W"), ("weight", "weight=W"),
    ("weight=1;weight=2", "weight=W")])
def test_a_bad_header_names_what_is_wrong(value: str, names: str) -> None:
    with pytest.raises(ValueError, match=names) as err:
        parse_class_header(value)
    assert TENANT_CLASS_HEADER in str(err.value)


def test_the_gateway_keys_line_is_the_ceiling() -> None:
    plain = ApiKey("kgw", "gw", "gw", role="gateway")  # weight 1, ceiling default
    generous = ApiKey("kgw", "gw", "gw", role="gateway", weight=10, max_priority="priority")
    asked = TenantClass(4.0, "priority", "priority")
    assert gateway_class(asked, plain) == TenantClass(1.0, "default", "default")
    assert gateway_class(asked, generous) == TenantClass(4.0, "priority", "priority")
    # below the ceiling, the tenant's own line passes unchanged
    low = TenantClass(0.5, "flex", "default")
    assert gateway_class(low, plain) == low and gateway_class(low, generous) == low
    # the default class never ends above the ceiling
    assert gateway_class(TenantClass(1.0, "priority", "default"), generous) == TenantClass(1.0, "default", "default")
