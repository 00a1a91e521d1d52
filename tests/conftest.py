"""Shared fixtures: a real Hearth server (real model, real port) for end-to-end tests."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tests.helpers import Server, start_server, stop_server
from tests.helpers.postgres import Postgres, start_postgres, stop_postgres


def pytest_collection_finish(session: pytest.Session) -> None:
    """What exists once the tests are collected (modules, their objects) lives for the whole run:
    moved out of the collector's sight, so the collection after each test (below) scans only
    what tests made, in milliseconds."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test() -> Iterator[None]:
    """Warnings are errors, and an object that leaks a file or socket warns when the garbage
    collector finalizes it: whenever that happens to run, so in whichever test is running then.
    Collecting after every test makes the warning, and the failure, land in the test that leaked,
    every time."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the e2e suite: the embedded default model, 8 slots. A queued request may
    wait 10 minutes for a slot: on a machine shared with other llama.cpp processes a step can
    take seconds, and the default 60 s would turn a test's deliberately queued request into a 429."""
    s = start_server(tmp_path_factory.mktemp("hearth"), "--parallel", "8", "--ctx", "2048", "--max-wait", "600")
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """One real PostgreSQL server (tests/helpers/postgres.py); each test that needs a clean
    database makes its own (`create_database`)."""
    pg = start_postgres()
    yield pg
    stop_postgres(pg)
