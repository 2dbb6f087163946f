"""Fixtures over the test bed (testbed.py): pattern files, loop devices and a tmpfs."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from pgserver import PostgresServer
from testbed import (CI_DEVICE, IS_ROOT, Misbehaving, detach_loop, ram_loop, sh,
                     write_pattern_file)

# Four workers share two cores (scripts/test): torch's own threads, as many as cores in every
# worker and every run a test starts, spin waiting for a core another worker holds. One thread
# each, set before anything imports torch (OpenMP reads it once); a value given is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The Ctrl-C tests send SIGINT to qual processes they start. A shell starts a background job
# with SIGINT ignored, and an ignored signal stays ignored across exec, so every such child
# would shrug the signal off (Python installs its KeyboardInterrupt handler only where SIGINT
# is not ignored). With a handler here, children start with the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    """Every qual run the tests start stores into a scratch store of this test session, never
    the user's (QUAL_STORE, inherited by the runs), removed at the end."""
    scratch = tempfile.mkdtemp(prefix="qual-test-store-")
    os.environ["QUAL_STORE"] = os.path.join(scratch, "store.sqlite")
    config.add_cleanup(lambda: shutil.rmtree(scratch, ignore_errors=True))
    _make_turns(config)


SOLO_WAIT_S = 1200  # the longest a test waits for its turn (a solo test waits for the others)


def _make_turns(config) -> None:
    """The controller's folder for the turn locks every xdist worker of this run shares
    (QUAL_TEST_TURNS, inherited by the workers it starts later), removed at the end. A pytest
    a test starts is a controller of its own, with turns of its own: it inherits its worker's
    environment, and would otherwise wait on the turns of the run it is part of."""
    if hasattr(config, "workerinput"):
        return
    turns = tempfile.mkdtemp(prefix="qual-test-turns-")
    os.environ["QUAL_TEST_TURNS"] = turns
    config.add_cleanup(lambda: shutil.rmtree(turns, ignore_errors=True))


def _lock(fd: int, how: int, what: str) -> None:
    deadline = time.monotonic() + SOLO_WAIT_S
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: no turn within {SOLO_WAIT_S} s") from None
            time.sleep(0.05)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked `solo` (one whose figure a busy host would move) runs with no other test
    beside it on any xdist worker: every test holds the room shared, a solo test holds it
    alone, and the gate in front of it lets no new test in while a solo test waits (so it
    waits only for the tests already running)."""
    turns = os.environ.get("QUAL_TEST_TURNS")
    if not turns:
        yield
        return
    solo = item.get_closest_marker("solo") is not None
    gate = os.open(os.path.join(turns, "gate"), os.O_CREAT | os.O_RDWR, 0o600)
    room = os.open(os.path.join(turns, "room"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        _lock(gate, fcntl.LOCK_EX, item.nodeid)
        _lock(room, fcntl.LOCK_EX if solo else fcntl.LOCK_SH, item.nodeid)
        if not solo:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        os.close(room)  # closing lets go of the locks
        os.close(gate)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (scripts/test, --dist loadgroup): the tests that share a module's
    fixture (a generated dataset, a run whose record several tests read) go to one worker,
    which makes it once rather than once a worker; the tests marked slow go out first, in
    their own order, so the workers fill the end of the run with short tests rather than wait
    on a long one handed out last; and a solo test goes out last, so that what it waits for
    (every test in flight to end) is short tests, not the long ones of the start, with the
    other workers held at its gate meanwhile. Serially the order is the files' own."""
    if not hasattr(config, "workerinput"):  # a worker collects what the controller hands out
        return
    here = Path(__file__).resolve().parent
    for item in items:
        if item.path.parent != here:  # a suite a test runs (tests/families) groups its own
            continue
        shared = sorted(name for name, defs in item._fixtureinfo.name2fixturedefs.items()
                        if defs and defs[-1].scope == "module")
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{'+'.join(shared)}"))
    items.sort(key=lambda item: (item.get_closest_marker("solo") is not None,
                                 item.get_closest_marker("slow") is None))


@pytest.fixture
def pattern_file(tmp_path):
    """Factory: a file of `size` bytes holding the verification pattern of `seed`."""

    def make(size: int = 8 << 20, seed: int = 42) -> Path:
        path = tmp_path / f"pattern-{seed}-{size}.dat"
        write_pattern_file(path, size, seed)
        return path

    return make


def _unmount(point: str, wait_s: float = 10.0) -> None:
    """umount, waiting out a short "target is busy": the kernel releases some files a moment
    after the last close (the engine's rings unregister theirs first; this is the net)."""
    deadline = time.monotonic() + wait_s
    while subprocess.run(["umount", point], capture_output=True).returncode and \
            os.path.ismount(point) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.fixture
def loop_device(tmp_path):
    """Factory: a loop device over a fresh backing file; every device is detached afterwards."""
    made: list[tuple[str, list[str]]] = []

    def make(size: int = 64 << 20, name: str = "loop.img") -> str:
        backing = tmp_path / name
        with open(backing, "wb") as f:
            f.truncate(size)
        dev = sh("losetup", "--find", "--show", str(backing))
        made.append((dev, backing, []))
        return dev

    def mount(dev: str, *, mkfs: tuple = (), options: str = "defaults") -> Path:
        # initialised in full now: ext4's lazy init would write to the device after mounting,
        # and the tests compare the device's bytes before and after qual touches it
        sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", *mkfs, dev)
        point = tmp_path / f"mnt-{Path(dev).name}"
        point.mkdir()
        sh("mount", "-o", options, dev, str(point))
        for d, _, mounts in made:
            if dev == d or dev.startswith(f"{d}p"):  # the loop device or one of its partitions
                mounts.append(str(point))
        return point

    def partition(dev: str, count: int = 1) -> str:
        """Write an MBR with `count` partitions of 8 MiB and make the kernel add them (BLKPG,
        via partx); returns the first one's node."""
        mbr = bytearray(512)
        for i in range(count):
            # entry: status, CHS start, type 0x83 (Linux), CHS end, LBA start, sectors
            entry = 446 + 16 * i
            mbr[entry:entry + 16] = (0).to_bytes(1, "little") + b"\0\0\0" + b"\x83" + \
                b"\0\0\0" + (2048 + 16384 * i).to_bytes(4, "little") + \
                (16384).to_bytes(4, "little")
        mbr[510:512] = b"\x55\xaa"
        with open(dev, "r+b") as f:
            f.write(mbr)
            f.flush()
            os.fsync(f.fileno())
        sh("partx", "--add", dev)
        return f"{dev}p1"

    make.mount = mount
    make.partition = partition
    yield make
    for dev, backing, mounts in reversed(made):
        for point in mounts:
            _unmount(point)
        _delete_partitions(dev)
        detach_loop(dev, backing)


def _delete_partitions(dev: str, wait_s: float = 10.0) -> None:
    """partx --delete, waiting out a busy partition: udev opens a partition to probe it after
    a writer closes it, and a partition left behind would greet the next test to get this
    loop device ("has partitions")."""
    sysfs = Path("/sys/block") / Path(dev).name
    deadline = time.monotonic() + wait_s
    while any(sysfs.glob(f"{sysfs.name}p*")) and time.monotonic() < deadline:
        subprocess.run(["partx", "--delete", dev], capture_output=True)
        time.sleep(0.1)


@pytest.fixture
def tmpfs(tmp_path):
    """A filesystem with no block device under it (root only)."""
    point = tmp_path / "tmpfs"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(point)], check=True)
    yield point
    _unmount(str(point))


@pytest.fixture
def misbehaving(tmp_path):
    """Factory: a folder on stallfs (testbed.Misbehaving), told how to misbehave by its flags;
    each is unmounted afterwards."""
    if not IS_ROOT or not os.path.exists("/dev/fuse"):
        pytest.skip("a misbehaving FUSE filesystem needs root and /dev/fuse")
    made: list[Misbehaving] = []

    def make(*flags: str, size: int | None = None) -> Misbehaving:
        made.append(Misbehaving(tmp_path / f"fuse{len(made)}", *flags, size=size))
        return made[-1]
    yield make
    for storage in made:
        storage.close()


@pytest.fixture
def ram_device():
    """Factory: a blank loop device over a file in /dev/shm (testbed.ram_loop); detached and
    its file removed afterwards."""
    names = itertools.count()
    with contextlib.ExitStack() as made:
        yield lambda size=CI_DEVICE: made.enter_context(ram_loop(str(next(names)), size))


# ---------------------------------------------------------------- the results store


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server (tests/pgserver.py) for the session, stopped at its end."""
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """An empty results store: an SQLite file, and a database of its own on the real server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    return request.getfixturevalue("postgres").new_database()
