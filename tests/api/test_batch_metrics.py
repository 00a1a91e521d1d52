"""The node's batches on /metrics (api/batches/metrics.py): batches by status, lines finished by
tenant and result, lines still to run. In-process over the fake runner; a running batch is held
at a line's test gate (hearth/test_gate.py), never timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearth.tenants import OPEN
from tests.api.conftest import Harness, serve
from tests.api.test_batches import ADMIN, ALICE, BOB, KEYS, batches_of, gate, line, submit
from tests.helpers import until
from tests.helpers.prometheus import sample


async def scrape(h: Harness) -> str:
    r = await h.client.get("/metrics", headers=ADMIN)
    assert r.status_code == 200, r.text
    return str(r.text)


async def test_batches_by_status_and_lines_by_tenant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as h:
        batches_of(h).start(h.app)
        try:
            text = await scrape(h)
            for status in ("validating", "in_progress", "completed", "failed", "cancelled", "expired"):
                assert sample(text, "hearth_batches", status=status) == 0
            assert sample(text, "hearth_batch_lines_total", 0.0) == 0
            a = await submit(h, [line("a0"), line("a1"), line("bad", messages="not a list")], headers=ALICE)
            await batches_of(h).idle()
            hold, waiting = gate(tmp_path, monkeypatch, "batch-line-1")
            b = await submit(h, [line(f"b{i}") for i in range(4)], headers=BOB)
            await until(waiting.exists, "bob's line 1 at its gate")
            await until(lambda: batches_of(h).store.get(b["id"], OPEN).completed == 1, "line 0 recorded")
            text = await scrape(h)
            assert sample(text, "hearth_batches", status="completed") == 1
            assert sample(text, "hearth_batches", status="in_progress") == 1
            assert sample(text, "hearth_batch_lines_total", tenant="team-a", result="completed") == 2
            assert sample(text, "hearth_batch_lines_total", tenant="team-a", result="failed") == 1
            assert sample(text, "hearth_batch_lines_total", tenant="team-b", result="completed") == 1
            assert sample(text, "hearth_batch_lines_pending", tenant="team-b") == 3
            assert sample(text, "hearth_batch_lines_pending", 0.0, tenant="team-a") == 0
            hold.unlink()
            await batches_of(h).idle()
            text = await scrape(h)
            assert sample(text, "hearth_batches", status="completed") == 2
            assert sample(text, "hearth_batches", status="in_progress") == 0
            assert sample(text, "hearth_batch_lines_total", tenant="team-b", result="completed") == 4
            assert sample(text, "hearth_batch_lines_pending", 0.0) == 0
            assert a["id"] != b["id"]
        finally:
            await batches_of(h).shutdown()


async def test_the_counts_survive_a_restart(tmp_path: Path) -> None:
    """Read from the batches' own records: a new node on the same data directory shows them."""
    async with serve(tmp_path) as h:
        batches_of(h).start(h.app)
        try:
            await submit(h, [line("x"), line("y")])
            await batches_of(h).idle()
        finally:
            await batches_of(h).shutdown()
    async with serve(tmp_path) as h:
        text = (await h.client.get("/metrics")).text
        assert sample(text, "hearth_batches", status="completed") == 1
        assert sample(text, "hearth_batch_lines_total", result="completed") == 2
