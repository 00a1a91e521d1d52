"""In-process API tests: the real app (routes, middleware, error handlers, session manager)
over a fake runner, driven through httpx's ASGI transport. No model, no port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from hearth.api.app import create_app
from hearth.backends.base import ModelCard
from hearth.backends.local import EngineSettings, LocalBackend
from hearth.chat.template import ChatTemplate
from hearth.config import Settings
from hearth.engine.fake_runner import FakeRunner
from hearth.models import ModelSpec

N_CTX = 512


@dataclass
class Api:
    app: Starlette
    client: httpx.AsyncClient
    backend: LocalBackend
    data_dir: Path


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"not a real model")

    def factory(spec: ModelSpec, settings: EngineSettings) -> Any:
        return FakeRunner(n_seq_max=2, n_batch=64), ModelCard(spec.id, 0, meta={"n_ctx": N_CTX}), ChatTemplate(None)

    backend = LocalBackend([ModelSpec("fake", model)], EngineSettings(parallel=2, batch=64), factory)
    await backend.start()
    app = create_app(backend, Settings(data_dir=tmp_path / "home", parallel=2, batch=64))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://hearth") as client:
        yield Api(app, client, backend, tmp_path / "home")
    await backend.stop()
    app.state.sessions.close()
