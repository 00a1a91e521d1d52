"""The upstream TOML and the gateway's settings checks."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hearth.gateway.settings import GatewaySettings, Upstream, parse_upstreams

FLEET = """
[[upstream]]
name = "a"
url = "http://10.0.0.5:8000/"
api_key = "ka"
models = { "smol" = "smollm2-135m-instruct" }
max_in_flight = 4

[[upstream]]
name = "gpu"
url = "https://gpu.example:8000"
kind = "openai"
models = ["qwen"]
"""


def test_parse_fleet() -> None:
    a, gpu = parse_upstreams(tomllib.loads(FLEET))
    assert (a.name, a.url, a.kind, a.max_in_flight, a.models) == (
        "a", "http://10.0.0.5:8000", "hearth", 4, {"smol": "smollm2-135m-instruct"})
    assert a.headers() == {"Authorization": "Bearer ka"} and a.headers(admin=True) == {"Authorization": "Bearer ka"}
    assert gpu.kind == "openai" and gpu.models == {"qwen": "qwen"} and gpu.headers() == {}
    s = GatewaySettings(upstreams=[a, gpu], data_dir=Path("/tmp"))
    assert s.aliases() == {"smol": [a], "qwen": [gpu]}


@pytest.mark.parametrize(("toml", "message"), [
    ('[[upstream]]\nurl = "http://x"\nmodels = ["m"]', "name is required"),
    ('[[upstream]]\nname = "a/b"\nurl = "http://x"\nmodels = ["m"]', "must match"),
    ('[[upstream]]\nname = "a"\nurl = "ftp://x"\nmodels = ["m"]', "url must start"),
    ('[[upstream]]\nname = "a"\nurl = "http://x"\nkind = "vllm"\nmodels = ["m"]', "kind must be"),
    ('[[upstream]]\nname = "a"\nurl = "http://x"', "at least one model"),
    ('[[upstream]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\npassword = "p"', "unknown keys"),
    ('[[upstream]]\nname = "a"\nurl = "http://x"\nmodels = { m = 3 }', "models must map"),
    ('[[upstream]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\nstall_timeout = -1', "stall_timeout must be"),
])
def test_bad_upstreams_are_refused_with_a_reason(toml: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_upstreams(tomllib.loads(toml))


def test_settings_checks() -> None:
    up = Upstream(name="a", url="http://x", models={"m": "m"})
    with pytest.raises(ValueError, match="share a name"):
        GatewaySettings(upstreams=[up, up])
    with pytest.raises(ValueError, match="not loopback"):
        GatewaySettings(upstreams=[up], host="0.0.0.0")
    with pytest.raises(ValueError, match="default-model"):
        GatewaySettings(upstreams=[up], default_model="nope")
    assert GatewaySettings(upstreams=[]).upstreams == []  # every node joins at run time (membership.py)
    with pytest.raises(ValueError, match="member-ttl"):
        GatewaySettings(upstreams=[up], member_ttl=0)
    with pytest.raises(ValueError, match="join-key"):
        GatewaySettings(upstreams=[up], join_key="")
    foreign = Upstream(name="f", url="http://y", kind="openai", models={"m": "m"})
    with pytest.raises(ValueError, match="alias 'm' is served by both hearth and openai upstreams"):
        GatewaySettings(upstreams=[up, foreign])
    own = Upstream(name="f", url="http://y", kind="openai", models={"other": "m"})
    assert list(GatewaySettings(upstreams=[up, own]).aliases()) == ["m", "other"]
    assert GatewaySettings(upstreams=[up], host="0.0.0.0", api_keys=["k"]).host == "0.0.0.0"


def test_stall_timeout_defaults_by_kind_and_per_upstream_overrides() -> None:
    a, gpu, quiet, watched = parse_upstreams(tomllib.loads(FLEET + """
[[upstream]]
name = "quiet"
url = "http://q"
models = ["m"]
stall_timeout = 0

[[upstream]]
name = "watched"
url = "http://w"
kind = "openai"
models = ["w"]
stall_timeout = 90
"""))
    s = GatewaySettings(upstreams=[a, gpu, quiet, watched], stall_timeout=12)
    assert [s.stall_timeout_for(u) for u in (a, gpu, quiet, watched)] == [12, None, None, 90]
    assert GatewaySettings(upstreams=[a]).stall_timeout_for(a) == 30  # the default for Hearth nodes
    assert GatewaySettings(upstreams=[a], stall_timeout=0).stall_timeout_for(a) is None
    with pytest.raises(ValueError, match="--stall-timeout"):
        GatewaySettings(upstreams=[a], stall_timeout=-1)


def test_the_database_is_a_postgresql_url_and_its_password_stays_out_of_errors_and_repr(tmp_path: Path) -> None:
    up = [Upstream(name="a", url="http://127.0.0.1:9", models={"m": "m"})]
    with pytest.raises(ValueError, match="postgresql://") as e:
        GatewaySettings(upstreams=up, data_dir=tmp_path, database="mysql://u:s3cret@db/h")
    assert "s3cret" not in str(e.value)
    gs = GatewaySettings(upstreams=up, data_dir=tmp_path, database="postgresql://u:s3cret@db/h")
    assert "s3cret" not in repr(gs)
    with pytest.raises(ValueError, match="lease-ttl"):
        GatewaySettings(upstreams=up, data_dir=tmp_path, lease_ttl=0)
