"""A real PostgreSQL server for the store's tests: Debian's own binaries (initdb, postgres) on a
scratch folder and a free loopback port, run as the `postgres` user (PostgreSQL refuses root),
stopped and removed at the end. Each test gets a database of its own.

The server is this process's own child, never pg_ctl's daemon: it dies with the tests however
they end (SIGTERM, kill -9), as every process qual starts dies with its qual, and its own
workers end once it is gone."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from qual import watchdog

START_S = 60  # the most a start or stop may take


def binaries() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


PORT_TRIES = 5


class PortTaken(RuntimeError):
    """The server could not listen: its port was taken after it was found free."""


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
        # a port found free is free only until something else binds it (the checkpoint ranks'
        # connections, another test's server): one taken by then is given up for a new one
        for _ in range(PORT_TRIES - 1):
            try:
                return self._launch(user)
            except PortTaken:
                self.port = free_port()
        return self._launch(user)

    def _launch(self, user) -> PostgresServer:
        log = open(self.folder / "server.log", "wb")
        parent = os.getpid()
        self.server = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-c", "listen_addresses=127.0.0.1",
             "-c", f"port={self.port}", "-c", f"unix_socket_directories={self.folder}",
             "-c", "max_connections=100", "-c", "fsync=on",
             # its dynamic shared memory in its folder, not /dev/shm: a server killed outright
             # (the tests killed) leaves those segments behind, and only its folder is removed
             "-c", "dynamic_shared_memory_type=mmap",
             "-c", "timezone=America/New_York"],  # not UTC: qual must not care
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/",
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": user.pw_dir, "LANG": "C"},
            preexec_fn=lambda: _become_dying_with_parent(user, parent))
        log.close()
        self.started = True
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + START_S
        while True:
            if self.server.poll() is not None:
                self.started = False
                said = (self.folder / "server.log").read_text()
                if "Address already in use" in said:
                    raise PortTaken(said[-2000:])
                raise RuntimeError(f"postgres exited with {self.server.returncode}: "
                                   f"{said[-2000:]}")
            try:
                with psycopg.connect(self.url(), connect_timeout=2) as db:
                    answering = db.execute("SHOW data_directory").fetchone()[0]
                if Path(answering).resolve() == self.data.resolve():
                    return
                # another test's server holds the port, and this one is on its way out
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not answer within {START_S} s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.started:
            self.server.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
            try:
                self.server.wait(START_S)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(10)
            self.started = False
        remove(self.folder)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database: its URL."""
        import psycopg

        name = "qual_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def remove(folder: Path) -> None:
    """A stopped server's folder, and what a server killed outright left outside it: its System
    V interlock segment, which the seventh line of its postmaster.pid names ("KEY SHMID"),
    removed only if no process is attached to it any more."""
    pid_file = Path(folder) / "data" / "postmaster.pid"
    lines = pid_file.read_text().splitlines() if pid_file.exists() else []
    if len(lines) >= 7 and len(lines[6].split()) == 2:
        shmid = lines[6].split()[1]
        shown = subprocess.run(["ipcs", "-m", "-i", shmid], capture_output=True, text=True)
        if "nattch=0" in shown.stdout.split():
            subprocess.run(["ipcrm", "-m", shmid], capture_output=True)
    shutil.rmtree(folder, ignore_errors=True)


def _become_dying_with_parent(user: pwd.struct_passwd, parent: int) -> None:
    """In the server's child, before exec: the postgres user's (PostgreSQL refuses root), then
    SIGKILL when the tests end however they end (qual's own watchdog.bind_to_parent). The
    parent-death signal is set after the user changes, since a change of user clears it."""
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    watchdog.bind_to_parent(parent)
