"""A real PostgreSQL server for the store's tests: Debian's own binaries (initdb, pg_ctl) on a
scratch folder and a free loopback port, run as the `postgres` user (PostgreSQL refuses root),
stopped and removed at the end. Each test gets a database of its own."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

START_S = 60  # the most a start or stop may take


def binaries() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """The server, in a folder of its own under /tmp or `root` (the postgres user must reach
    it, and pytest's own tmp folders are root's alone)."""

    def __init__(self, root: str | None = None):
        self.bin = binaries()
        if self.bin is None:
            raise RuntimeError("PostgreSQL is not installed (scripts/setup installs it)")
        self.folder = Path(tempfile.mkdtemp(prefix="qual-postgres-", dir=root))
        self.data = self.folder / "data"
        self.port = free_port()
        self.user = "postgres"
        self.started = False

    def _as_postgres(self, *cmd: str, timeout: float = START_S) -> None:
        user = pwd.getpwnam(self.user)
        done = subprocess.run(["runuser", "-u", self.user, "--", *cmd], timeout=timeout,
                              capture_output=True, text=True, cwd="/",
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                   "HOME": user.pw_dir, "LANG": "C"})
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr}")

    def start(self) -> PostgresServer:
        user = pwd.getpwnam(self.user)
        os.chown(self.folder, user.pw_uid, user.pw_gid)
        self._as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user,
                          "--auth=trust", "-E", "UTF8", "--no-sync")
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-c unix_socket_directories={self.folder} -c max_connections=100 "
                   "-c fsync=on -c timezone=America/New_York")  # not UTC: qual must not care
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options,
                          "-l", str(self.folder / "server.log"), "-w", "-t", str(START_S),
                          "start")
        self.started = True
        return self

    def stop(self) -> None:
        if self.started:
            self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast",
                              "-w", "-t", str(START_S), "stop")
            self.started = False
        shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database: its URL."""
        import psycopg

        name = "qual_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
