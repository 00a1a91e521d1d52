"""The run fields every generating protocol shares, and the one admin rule, without a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hearth.api.http.run_options import RunFields, repetition, wall_cap
from hearth.config import Settings
from hearth.engine.repetition import RepetitionSpec
from hearth.errors import BadRequest
from hearth.http.access import AccessSettings
from hearth.http.auth import AuthMiddleware


def server(**settings: Any) -> Settings:
    return Settings(**settings)


def fields(**kw: Any) -> RunFields:
    return RunFields.model_validate(kw)


def test_repetition_detection_top_level_in_extra_and_the_server_default() -> None:
    assert repetition(server(), fields()) is None
    assert repetition(server(repetition_detection=True), fields()) == RepetitionSpec()
    assert repetition(server(repetition_detection=True), fields(repetition_detection=False)) == \
        RepetitionSpec(enabled=False)
    assert repetition(server(), fields(extra={"repetition_detection": {"min_repeats": 3}})) == \
        RepetitionSpec(min_repeats=3)
    # the top-level field wins over extra
    assert repetition(server(), fields(repetition_detection=True, extra={"repetition_detection": False})) == \
        RepetitionSpec()
    with pytest.raises(BadRequest) as e:
        repetition(server(), fields(repetition_detection={"max_period": 0}))
    assert e.value.param == "repetition_detection"
    with pytest.raises(BadRequest) as e:
        repetition(server(), fields(extra={"repetition_detection": "on"}))
    assert e.value.param == "extra.repetition_detection"


def test_t_max_predict_ms_is_timeout_in_milliseconds() -> None:
    assert wall_cap(server(), fields(t_max_predict_ms=2500)) == 2.5
    assert wall_cap(server(), fields(timeout=7)) == 7
    assert wall_cap(server(request_timeout=30), fields()) == 30
    for kw, param in (({"timeout": 1, "t_max_predict_ms": 1000}, "t_max_predict_ms"),
                      ({"t_max_predict_ms": 4_000_000}, "t_max_predict_ms"), ({"timeout": 4000}, "timeout")):
        with pytest.raises(BadRequest) as e:
            wall_cap(server(), fields(**kw))
        assert e.value.param == param


def verdict(method: str, path: str, key: str | None) -> int | None:
    access = AccessSettings.of(Settings(api_keys=["k"], admin_key="adm", metrics_token="m"))
    mw = AuthMiddleware(lambda *a: None, access)  # type: ignore[arg-type]
    v = mw._verdict(method, path, key)
    return v.status if v else None


@pytest.mark.parametrize("path", ["/v1/sessions/s", "/v1/snapshots/snap_x", "/v1/responses/resp_x", "/v1/other"])
def test_every_delete_needs_the_admin_key(path: str) -> None:
    assert verdict("DELETE", path, "k") == 403
    assert verdict("DELETE", path, "adm") is None
    assert verdict("DELETE", path, None) == 401


def test_the_admin_key_reads_metrics_and_other_keys_do_what_they_did() -> None:
    assert verdict("GET", "/metrics", "adm") is None
    assert verdict("GET", "/metrics", "m") is None and verdict("GET", "/metrics", "k") is None
    assert verdict("GET", "/metrics", "x") == 401
    assert verdict("POST", "/v1/sessions/s/rollback", "k") is None  # not destructive: any key
    assert verdict("GET", "/v1/models", "m") == 401  # the metrics token is for /metrics only


def test_keep_alive_reads_ollamas_values_and_names_itself_when_bad() -> None:
    from hearth.api.http.run_options import keep_alive

    assert keep_alive(None) is None
    assert [keep_alive(v) for v in (0, 30, "90s", "5m", "1h30m", "250ms", "300")] == \
        [0.0, 30.0, 90.0, 300.0, 5400.0, 0.25, 300.0]
    assert keep_alive(-1) == keep_alive("-1") == float("inf")  # negative: keep it loaded
    for bad in ("soon", "5x", "", "m", "1.5.5"):
        with pytest.raises(BadRequest) as err:
            keep_alive(bad)
        assert err.value.param == "keep_alive"


def test_model_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="--models-max 1 is less than the 2 models"):
        server(models=["a", "b"], models_max=1)
    with pytest.raises(ValueError, match="--models-max"):
        server(models_max=0)
    with pytest.raises(ValueError, match="--models-dir"):
        server(models_dir=Path("/nonexistent/models"))
    with pytest.raises(ValueError, match="--models-ram-mb"):
        server(models_ram_mb=-1)
