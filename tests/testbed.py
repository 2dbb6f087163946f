"""The test bed: real files with known data, loop devices, and suite runs in a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from qual import engine, shipped

HERE = Path(__file__).resolve().parent
TINY_PROFILE = HERE / "profiles" / "tiny.toml"
TINY_ALL = HERE / "profiles" / "tiny-all.toml"
KILL = HERE / "profiles" / "kill.toml"  # tiny-all to be killed mid-run (tests/test_rig.py)
IS_ROOT = os.geteuid() == 0


def write_pattern_file(path: Path, size: int, seed: int) -> None:
    """A file holding the engine's verification pattern for `seed`, written by Python."""
    chunk = 1 << 20
    buf = bytearray(chunk)
    with open(path, "wb") as f:
        for offset in range(0, size, chunk):
            n = min(chunk, size - offset)
            view = memoryview(buf)[:n]
            engine.pattern_fill(view, seed, offset)
            f.write(view)
        f.flush()
        os.fsync(f.fileno())


def flip_byte(path: str | Path, offset: int, mask: int = 0x40) -> None:
    """Corrupt one byte of a file in place, durably (a drive returning one wrong byte)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ mask]))
        f.flush()
        os.fsync(f.fileno())


def sha256_of(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


@contextmanager
def time_limit(seconds: float, what: str):
    """Raise TimeoutError in this (the main) thread after `seconds`, as pytest-timeout does, so
    that one call that does not end fails with its own traceback and leaves the rest of the test
    session running. The test's own pytest-timeout alarm is put back afterwards."""
    def expired(signum, frame):
        raise TimeoutError(f"{what}: still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 1e-3))


def os_threads() -> set[int]:
    """The ids of this process's threads, as the kernel lists them (native ones included)."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}


needs_root = pytest.mark.skipif(not IS_ROOT or not shutil.which("losetup"),
                                reason="loop devices need root and losetup")


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def run_suite(tmp_path: Path, *args: str, profile: Path | str = TINY_PROFILE,
              suite: str = "test_bandwidth.py", alluredir: bool = True,
              env_extra: dict | None = None,
              timeout: int = 300) -> tuple[subprocess.CompletedProcess, Path]:
    """Run a shipped suite (all of them with suite="") in a fresh pytest process from
    tmp_path; returns the process and the results folder (qual-run.json, allure-results/)."""
    results = tmp_path / "results"
    # as `qual run` loads it: without the plugins a qualification never uses (hypothesis's
    # import alone is about a second of CPU, in each of some 80 suite runs of the tests)
    cmd = [sys.executable, "-m", "pytest", str(shipped("suites") / suite), "-p", "no:cacheprovider",
           "-p", "no:benchmark", "-p", "no:hypothesispytest", f"--qual-profile={profile}",
           f"--qual-results={results}",
           "-o", "console_output_style=classic", *args]
    if alluredir:
        cmd.append(f"--alluredir={results / 'allure-results'}")
    env = {**os.environ, **(env_extra or {})}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env=env)
    return proc, results


def cells_profile(path: Path, description: str, patterns: list[str], *, runtime: str,
                  profile: str = "", bandwidth: str = "", minimum: list[str] = ()) -> Path:
    """A profile of bandwidth cells at 64K and QD4 over a 16 MiB region, one per pattern, with
    extra `profile` and `bandwidth` lines and a `min 1 MiB/s` criterion for each metric in
    `minimum`."""
    text = (f'[profile]\ndescription = "{description}"\n{profile}[bandwidth]\nsize = "16 MiB"\n'
            f'runtime = "{runtime}"\nblock_sizes = ["64K"]\ndepths = [4]\n'
            f'patterns = {json.dumps(patterns)}\n{bandwidth}')
    for metric in minimum:
        text += (f'\n[[bandwidth.criteria]]\nmetric = "{metric}"\n'
                 'params = { bs = "64K", qd = 4 }\nmin = 1\nunit = "MiB/s"\n'
                 'source = "tests"\nseverity = "critical"\n')
    path.write_text(text)
    return path


def load_record(results: Path) -> dict:
    return json.loads((results / "qual-run.json").read_text())


class Chromium:
    """A headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-
    pipe: commands on its fd 3, answers on its fd 4, each a JSON message ending in NUL)."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000):
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()

        def wire():  # runs in the child before it closes the fds it does not keep
            os.dup2(cmd_r, 3)
            os.dup2(res_w, 4)

        # a profile of its own: two browsers on one profile (tests under -n 2) would share
        # one process, and one's pages answer the other's commands
        self._profile = tempfile.mkdtemp(prefix="qual-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
             "about:blank"],
            pass_fds=(3, 4), preexec_fn=wire, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(res_w)
        self._next, self._buf = 0, b""

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._res_r, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                self._buf += chunk
            raw, _, self._buf = self._buf.partition(b"\0")
            answer = json.loads(raw)
            if answer.get("id") == self._next:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def open(self, url: str) -> str:
        """A new page at url; returns its session."""
        target = self.call("Target.createTarget", url=url)["targetId"]
        return self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def loaded(self, url: str, timeout: float = 30) -> str:
        """A new page at url, once that document (not the about:blank a new page starts as)
        has loaded; returns its session."""
        page = self.open(url)
        deadline = time.monotonic() + timeout
        while self.evaluate(page, "location.href + ' ' + document.readyState") != \
                f"{url} complete":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not load within {timeout} s")
            time.sleep(0.1)
        return page

    def evaluate(self, session: str, expression: str):
        out = self.call("Runtime.evaluate", session, expression=expression, returnByValue=True)
        return out.get("result", {}).get("value")

    def screenshot(self, session: str) -> bytes:
        import base64

        return base64.b64decode(self.call("Page.captureScreenshot", session, format="png")["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._cmd_w)
        os.close(self._res_r)
        shutil.rmtree(self._profile, ignore_errors=True)


class Misbehaving:
    """A folder on stallfs.py: a FUSE passthrough to a backing folder that misbehaves as told
    (reads that never complete, a storage that stops answering everything, EIO for a range,
    slow flushes, a log of every request). Needs root and /dev/fuse."""

    def __init__(self, point: Path, *flags: str, size: int | None = None):
        self.point, self.backing = point, point.with_name(point.name + "-backing")
        point.mkdir()
        self.backing.mkdir()
        self.log = point.with_name(point.name + ".log")
        cmd = [sys.executable, str(Path(__file__).with_name("stallfs.py")), str(point),
               str(self.backing), "--log", str(self.log), *flags]
        if size is not None:
            cmd += ["--size", str(size)]
        self.daemon = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
        with time_limit(10, "mounting stallfs"):
            line = self.daemon.stdout.readline()
        if line.strip() != "ready":
            self.daemon.kill()
            pytest.skip(f"stallfs could not mount here: {self.daemon.stderr.read().strip()}")

    @property
    def file(self) -> Path:
        return self.point / "stall.dat"

    def stop(self) -> None:
        """Stop answering anything, now."""
        self.daemon.send_signal(signal.SIGUSR1)

    def stopped_at(self) -> float:
        """When it stopped answering (time.monotonic(), shared by every process)."""
        with time_limit(60, "stallfs stopping"):
            line = self.daemon.stdout.readline()
        assert line.startswith("stopped "), line
        return float(line.split()[1])

    def requests(self) -> list[tuple[str, str]]:
        """(operation, path) of every request answered, in order; a rename's path is
        "old -> new"."""
        return [tuple(line.rsplit(" ", 1)[0].split(" ", 1))
                for line in self.log.read_text().splitlines()]

    def close(self) -> None:
        self.daemon.kill()  # the connection aborts: requests still waiting fail
        self.daemon.wait(timeout=10)
        subprocess.run(["umount", "-l", str(self.point)], capture_output=True)


# ------------------------------------------------------------------ raw namespaces

CI_DEVICE = 2 << 30  # a blank RAM-backed namespace large enough for the ci profile


def qual(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qual.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def serial_of(dev: str) -> str:
    """A loop device's stand-in serial: its backing file."""
    return sh("losetup", "--noheadings", "--output", "BACK-FILE", dev)


def overwrite(path, offset: int, data: bytes) -> None:
    """Bytes written over a file or device at `offset`, durable: damage a test plants."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def loops_of(backing: str | Path) -> list[str]:
    """The loop devices that hold `backing` now."""
    out = subprocess.run(["losetup", "--noheadings", "--output", "NAME", "--associated",
                          str(backing)], capture_output=True, text=True)
    return out.stdout.split()


def detach_loop(dev: str, backing: str | Path) -> None:
    """Detach `dev` if it is still the loop device over `backing`. A device detached earlier
    (a test that takes a drive away) is free once its last holder lets go, and another test's
    `losetup --find` may get the same name meanwhile: a detach by name alone would take that
    test's drive away (it then held 0 B and no backing file, in CI)."""
    try:
        now = Path(f"/sys/block/{Path(dev).name}/loop/backing_file").read_text().strip()
    except OSError:
        return  # no longer bound to anything
    if now.removesuffix(" (deleted)") == str(Path(backing).resolve()):
        subprocess.run(["losetup", "--detach", dev], capture_output=True)


@contextmanager
def ram_loop(name: str, size: int = CI_DEVICE):
    """A blank loop device over a file in /dev/shm (the host, not a disk, is the limit);
    unmounted, detached and its file removed afterwards."""
    backing = Path("/dev/shm") / f"qual-test-{os.getpid()}-{name}.img"
    with open(backing, "wb") as f:
        f.truncate(size)
    dev = sh("losetup", "--find", "--show", str(backing))
    try:
        yield dev
    finally:
        subprocess.run(["umount", dev], capture_output=True)
        detach_loop(dev, backing)
        for moved in loops_of(backing):  # a power cut may have attached it elsewhere
            subprocess.run(["losetup", "--detach", moved], capture_output=True)
        backing.unlink(missing_ok=True)


def blank(dev: str) -> bool:
    """blkid finds no signature (exit 2) and nothing has the device mounted or held."""
    probe = subprocess.run(["blkid", "-p", dev], capture_output=True, text=True)
    mounted = subprocess.run(["findmnt", "--source", dev], capture_output=True, text=True)
    held = os.listdir(f"/sys/class/block/{Path(dev).name}/holders")
    return probe.returncode == 2 and not mounted.stdout.strip() and not held
