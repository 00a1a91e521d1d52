"""The gateway's batches on /metrics (gateway/batches/metrics.py): batches by status from its
store, lines it recorded by tenant and result, batches it runs now. In-process over two node
apps (tests/api/test_gateway_batches.py's world); a running batch is held at the runner's test
gate, never timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearth import test_gate
from tests.api.test_gateway_batches import ALICE, BOB, line, world
from tests.helpers import until
from tests.helpers.prometheus import sample


async def test_batches_by_status_lines_by_tenant_and_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    folder = tmp_path / "gates"
    folder.mkdir()
    monkeypatch.setenv(test_gate.ENV, str(folder))
    async with world(tmp_path, concurrency=1) as w:
        async def scrape() -> str:
            r = await w.gw.get("/metrics", headers=ALICE)
            assert r.status_code == 200, r.text
            return r.text

        text = await scrape()
        assert sample(text, "hearth_gateway_batches", status="completed") == 0
        assert sample(text, "hearth_gateway_batches_running") == 0
        a = await w.submit([line("a0"), line("a1"), line("bad", messages="not a list")])
        assert (await w.done(a["id"]))["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
        hold = test_gate.hold_path(folder, "gateway-batch-line-1")
        hold.touch()
        b = await w.submit([line("b0"), line("b1")], who=BOB)
        await until(test_gate.waiting_path(folder, "gateway-batch-line-1").exists, "bob's batch held before line 1")
        text = await scrape()
        assert sample(text, "hearth_gateway_batches", status="completed") == 1
        assert sample(text, "hearth_gateway_batches", status="in_progress") == 1
        assert sample(text, "hearth_gateway_batches_running") == 1
        assert sample(text, "hearth_gateway_batch_lines_total", tenant="team-a", result="completed") == 2
        assert sample(text, "hearth_gateway_batch_lines_total", tenant="team-a", result="failed") == 1
        assert sample(text, "hearth_gateway_batch_lines_total", tenant="team-b", result="completed") == 1
        hold.unlink()
        assert (await w.done(b["id"], BOB))["status"] == "completed"
        text = await scrape()
        assert sample(text, "hearth_gateway_batches", status="completed") == 2
        assert sample(text, "hearth_gateway_batches", status="in_progress") == 0
        assert sample(text, "hearth_gateway_batches_running") == 0
        assert sample(text, "hearth_gateway_batch_lines_total", tenant="team-b", result="completed") == 2
