"""The node's background responses as tasks: each live run's task and cancel token, held until it
ends, and a shutdown that ends them all (each records itself `failed`). Their events are in
`hearth.protocols.responses_log`; the gateway's own are `hearth.gateway.background`."""

from __future__ import annotations

import asyncio

from hearth.chat.cancel import CancelToken
from hearth.protocols.responses_log import SHUTDOWN_GRACE, EventLogs


class BackgroundRuns:
    """The node's background responses: each live run's task and cancel token, and the event
    logs (`logs`) of live and recently ended ones. The tasks are held here (the event loop keeps
    only weak references) until they end."""

    def __init__(self, logs: EventLogs | None = None) -> None:
        self.logs = logs or EventLogs()
        self._runs: dict[str, tuple[asyncio.Task[None], CancelToken]] = {}

    def add(self, response_id: str, task: asyncio.Task[None], token: CancelToken) -> None:
        self._runs[response_id] = (task, token)
        task.add_done_callback(lambda t: self._runs.pop(response_id, None) if self._runs.get(
            response_id, (None,))[0] is t else None)

    def __len__(self) -> int:
        return len(self._runs)

    async def shutdown(self, grace: float = SHUTDOWN_GRACE) -> None:
        """Cancel every background run ("shutdown": each records itself `failed`) and wait up to
        `grace` seconds for them to end; any still running then is cancelled as a task (its
        `finally` records the end). Its slot is released either way."""
        runs = list(self._runs.values())
        for _, token in runs:
            token.cancel("shutdown")
        tasks = [task for task, _ in runs]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
