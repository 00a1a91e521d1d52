"""What tests share beside fixtures (fixtures stay in the conftest.py files): real servers
(`servers`), a real PostgreSQL server (`postgres`, imported from its module), polling for a
condition another process or thread reaches (`polling`), and reading Prometheus samples
(`prometheus`). One definition of each, imported as `from tests.helpers import …`."""

from tests.helpers.polling import until, wait_until
from tests.helpers.prometheus import sample
from tests.helpers.servers import EXACT, Server, free_port, start_server, stop_server, wait_healthy

__all__ = ["EXACT", "Server", "free_port", "sample", "start_server", "stop_server", "until", "wait_healthy",
           "wait_until"]
