"""A real PostgreSQL server for the tests: Debian's (scripts/setup.sh installs the `postgresql`
package) initialised in a temporary directory, on a free port, with a password; stopped by its
pid. initdb refuses to run as root (CI runs as root): then every PostgreSQL command runs as the
`postgres` user, and the directory is that user's."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.polling import wait_until
from tests.helpers.servers import free_port

USER, PASSWORD = "hearth", "pg-secret-4b1d"  # a password: the tests check it is never shown


def _bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("no PostgreSQL under /usr/lib/postgresql (scripts/setup.sh installs the postgresql package)")
    return Path(found[-1]).parent


def _as_owner(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass
class Postgres:
    root: Path  # the temporary directory: data/, the log, the password file
    port: int

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def pid(self) -> int | None:
        """The postmaster's pid while it runs (its postmaster.pid file), else None."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def start(self) -> None:
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
        subprocess.run(_as_owner([str(_bin() / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts,
                                  "-w", "-t", "60", "start"]), check=True, capture_output=True)

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster), waited for until the process is gone."""
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGINT)
        wait_until(lambda: self.pid() is None, "PostgreSQL to stop", timeout=60)

    def create_database(self) -> str:
        """A fresh, empty database; its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        env = {**os.environ, "PGPASSWORD": PASSWORD}
        subprocess.run([str(_bin() / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name],
                       check=True, capture_output=True, env=env)
        return self.url(name)


def start_postgres() -> Postgres:
    root = Path(tempfile.mkdtemp(prefix="hearth-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    pwfile = root / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:
        shutil.chown(pwfile, "postgres", "postgres")
    pg = Postgres(root, free_port())
    subprocess.run(_as_owner([str(_bin() / "initdb"), "-D", str(pg.data), "-U", USER, f"--pwfile={pwfile}",
                              "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8"]),
                   check=True, capture_output=True)
    pg.start()
    return pg


def stop_postgres(pg: Postgres) -> None:
    pg.stop()
    shutil.rmtree(pg.root, ignore_errors=True)
