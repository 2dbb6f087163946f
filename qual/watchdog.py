"""A run that ends whatever the storage does (docs/ARCHITECTURE.md §4, "A watchdog").

A storage that stops answering can block any system call on it — a submission, a read, a
stat, an unlink, a close, an fsync — in any thread, of this process or of its children (the
checkpoint's rank processes). The engine's own stall clock catches a command that stays
outstanding while its queue keeps running; it cannot help a thread that sits inside the kernel.

This watchdog asks the kernel instead, never the target: every half second it reads, from
/proc, what system call every thread of this process and its descendants is in, and how many
times each has been switched out. A thread that has sat in the same file-system call on a file
(not a pipe, a socket or a terminal), with the same arguments and without once being woken,
for longer than the limit is stalled: the call cannot be finishing, only waiting. The watchdog
then hands a `Stall` (which call, on which file, at which offset, for how long) to its
`on_stall`, on its own thread, since the stuck one may never return. `on_stall` ends the
process itself (qual.cli and the pytest plugin each write what they must first); the watchdog
touches nothing on the target, and nothing it does depends on the stuck thread."""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

POLL_S = 0.5
DEFAULT_COMMAND_TIMEOUT_S = 30.0  # NVMe's: an I/O outstanding this long is a stall
SLACK_S = 1.0  # past the command timeout: the engine's own stall error comes first where it can

# the system calls that touch a file or a path, by number, for the two architectures qual runs
# on (x86_64's own table; aarch64's is the generic one)
_X86_64 = {0: "read", 1: "write", 2: "open", 3: "close", 4: "stat", 5: "fstat", 6: "lstat",
           16: "ioctl", 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev",
           21: "access", 40: "sendfile", 74: "fsync", 75: "fdatasync", 76: "truncate",
           77: "ftruncate", 78: "getdents", 80: "chdir", 82: "rename", 83: "mkdir",
           84: "rmdir", 85: "creat", 86: "link", 87: "unlink", 89: "readlink",
           137: "statfs", 138: "fstatfs", 162: "sync", 188: "setxattr", 189: "lsetxattr",
           190: "fsetxattr", 191: "getxattr", 192: "lgetxattr", 193: "fgetxattr",
           217: "getdents64", 257: "openat", 258: "mkdirat", 262: "newfstatat",
           263: "unlinkat", 264: "renameat", 267: "readlinkat", 269: "faccessat",
           277: "sync_file_range", 285: "fallocate", 295: "preadv", 296: "pwritev",
           306: "syncfs", 316: "renameat2", 326: "copy_file_range", 327: "preadv2",
           328: "pwritev2", 332: "statx", 426: "io_uring_enter", 437: "openat2",
           439: "faccessat2"}
_GENERIC = {5: "setxattr", 6: "lsetxattr", 7: "fsetxattr", 8: "getxattr", 9: "lgetxattr",
            10: "fgetxattr", 29: "ioctl", 34: "mkdirat", 35: "unlinkat", 38: "renameat",
            43: "statfs", 44: "fstatfs", 45: "truncate", 46: "ftruncate", 47: "fallocate",
            48: "faccessat", 49: "chdir", 56: "openat", 57: "close", 61: "getdents64",
            63: "read", 64: "write", 65: "readv", 66: "writev", 67: "pread64", 68: "pwrite64",
            69: "preadv", 70: "pwritev", 71: "sendfile", 78: "readlinkat", 79: "newfstatat",
            80: "fstat", 81: "sync", 82: "fsync", 83: "fdatasync", 84: "sync_file_range",
            267: "syncfs", 276: "renameat2", 285: "copy_file_range", 286: "preadv2",
            287: "pwritev2", 291: "statx", 426: "io_uring_enter", 437: "openat2",
            439: "faccessat2"}
SYSCALLS = _X86_64 if platform.machine() == "x86_64" else _GENERIC
# calls whose first argument is a file descriptor, and where their offset argument is
BY_FD = {"read", "write", "close", "fstat", "ioctl", "pread64", "pwrite64", "readv", "writev",
         "fsync", "fdatasync", "ftruncate", "getdents", "getdents64", "fstatfs", "fgetxattr",
         "fsetxattr", "sync_file_range", "fallocate", "preadv", "pwritev", "preadv2",
         "pwritev2", "io_uring_enter", "syncfs", "copy_file_range"}
OFFSET_ARG = {"pread64": 3, "pwrite64": 3, "preadv": 3, "pwritev": 3, "preadv2": 3,
              "pwritev2": 3, "sync_file_range": 1, "fallocate": 2}
IORING_ENTER_REGISTERED_RING = 1 << 4  # io_uring_enter's first argument is then no descriptor,
#                                      but the ring's slot among the thread's registered rings
IO_URING = "io_uring submission or completion"
NOT_STORAGE = ("pipe:", "socket:", "anon_inode:[eventfd]", "anon_inode:[eventpoll]",
               "anon_inode:[timerfd]", "anon_inode:[signalfd]", "/dev/pts/", "/dev/tty",
               "/dev/null", "/dev/ptmx", "/proc/", "/sys/", "/dev/urandom", "/dev/random",
               "/dev/fuse")  # a FUSE server waiting for its next request is idle, not stuck


@dataclass(frozen=True)
class Stall:
    """A thread that sat in one system call on storage for `age` seconds; `cause`: the engine's
    own stall error that came first, where one did (storage_stalled)."""

    pid: int
    tid: int
    call: str
    file: str | None
    offset: int | None
    age: float
    limit: float
    cause: str | None = None

    def __str__(self) -> str:
        where = f" on {self.file}" if self.file else ""
        at = f" at offset {self.offset}" if self.offset is not None else ""
        who = "" if self.pid == os.getpid() else f" (process {self.pid})"
        first = f"{self.cause}; then " if self.cause else ""
        return (f"{first}{self.call}{where}{at} has not returned for {self.age:.1f} s{who}: the "
                f"storage stopped answering (command timeout {self.limit - SLACK_S:g} s)")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the thread or process ended meanwhile
        return None


def _descendants(pid: int) -> list[int]:
    """pid and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for tid in _tasks(p):
            children = _read(f"/proc/{p}/task/{tid}/children") or ""
            todo += [int(c) for c in children.split()]
    return out


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _state(pid: int, tid: int) -> tuple[str, int] | None:
    """The thread's scheduler state (R, S, D, T…) and how many times it has been switched out."""
    text = _read(f"/proc/{pid}/task/{tid}/status")
    if text is None:
        return None
    lines = text.splitlines()
    state = next((line.split()[1] for line in lines if line.startswith("State:")), "?")
    return state, sum(int(line.split()[1]) for line in lines if line.startswith(
        ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))


PAGE_FAULT = "a page fault (a read of memory-mapped storage)"


def _storage_call(pid: int, line: str, files: dict,
                  state: str = "S") -> tuple[str, str | None, int | None] | None:
    """(call, file, offset) when the /proc syscall line is a call on storage, else None.
    `files` remembers what each descriptor named when last seen: a close on another thread
    takes it out of the table while this call still waits on it. A thread asleep outside any
    system call ("-1", state S or D, not T: stopped by a signal or a debugger) waits in a page
    fault: a memory-mapped file whose storage does not answer (the mmap loader's features)."""
    parts = line.split()
    if not parts or parts[0] == "running":
        return None
    if parts[0] == "-1":
        return (PAGE_FAULT, None, None) if state in ("S", "D") else None
    try:
        call = SYSCALLS.get(int(parts[0]))
        args = [int(a, 16) for a in parts[1:7]]
    except ValueError:
        return None
    if call is None:
        return None
    if call not in BY_FD:
        return call, None, None  # a path: lookups on a dead file system wait here
    fd = args[0]
    if call == "io_uring_enter" and args[3] & IORING_ENTER_REGISTERED_RING:
        return call, IO_URING, None  # fd 0 would name standard input, and be passed over
    try:
        file = files[(pid, fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        file = files.get((pid, fd))
        if file is None:
            return (call, None, None) if call == "close" else None  # close drops the fd first
    if file.startswith(NOT_STORAGE):
        return None
    if file.startswith("anon_inode:") and "io_uring" not in file:
        return None
    offset = args[OFFSET_ARG[call]] if call in OFFSET_ARG else None
    if offset is None and call in ("read", "write", "readv", "writev"):
        info = _read(f"/proc/{pid}/fdinfo/{fd}") or ""
        pos = [x.split()[1] for x in info.splitlines() if x.startswith("pos:")]
        offset = int(pos[0]) if pos else None
    return call, (IO_URING if "io_uring" in file else file), offset


_RUNNING: set["Watchdog"] = set()


def storage_stalled(cause: str, target: str | None) -> None:
    """The engine found an I/O the storage never completed (`cause`, its error, on `target`):
    the command timeout has been spent once. Every running watchdog now allows any further call
    on that file, or by path (an unlink, a stat: which file is not known), only SLACK_S, so
    that a cleanup that blocks on the same dead storage ends the command at once rather than
    after a second command timeout; its Stall names the cause first. Calls on other files (a
    second drive's flush) keep the whole limit."""
    for dog in list(_RUNNING):
        dog.stalled.add(os.path.abspath(target) if target else None)  # no realpath: it stats
        dog.cause = dog.cause or cause


class Watchdog:
    """Watches this process and its descendants for a thread stuck on storage longer than
    `limit` seconds; calls `on_stall(stall)` once, from its own thread."""

    def __init__(self, limit: float, on_stall: Callable[[Stall], None]):
        self.limit = limit
        self.stalled: set[str | None] = set()  # files the engine found stalled (None: any)
        self.cause: str | None = None
        self.on_stall = on_stall
        self._seen: dict[tuple[int, int], tuple[str, int, float]] = {}
        self._files: dict[tuple[int, int], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="qual-watchdog", daemon=True)
        self.fired: Stall | None = None

    def start(self) -> "Watchdog":
        _RUNNING.add(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        _RUNNING.discard(self)
        self._stop.set()

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def check(self, now: float | None = None) -> Stall | None:
        """One look at every thread: the longest stall past the limit, if any."""
        now = time.monotonic() if now is None else now
        me = threading.get_native_id()
        seen, worst = {}, None
        for pid in _descendants(os.getpid()):
            for tid in _tasks(pid):
                if tid == me:
                    continue
                line = _read(f"/proc/{pid}/task/{tid}/syscall")
                status = _state(pid, tid)
                if line is None or status is None:
                    continue
                state, switches = status
                line = " ".join(line.split()[:7])  # the call and its arguments, not sp/pc
                before = self._seen.get((pid, tid))
                since = before[2] if before and before[:2] == (line, switches) else now
                seen[(pid, tid)] = (line, switches, since)
                what = _storage_call(pid, line, self._files, state)  # every time: learns fds
                if now - since <= self._limit_for(what):
                    continue
                if what and (worst is None or now - since > worst.age):
                    worst = Stall(pid, tid, *what, age=now - since, limit=self.limit,
                                  cause=self.cause)
        self._seen = seen
        return worst

    def _limit_for(self, what) -> float:
        """How long this call may sit: SLACK_S once the engine found its file stalled (or for a
        call whose file is not known, after any stall), else the limit."""
        if self.stalled and what and (what[1] is None or what[1] in self.stalled or
                                      not what[1].startswith("/")):
            return SLACK_S
        return self.limit

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            stall = self.check()
            if stall is not None:
                self.fired = stall
                self.on_stall(stall)
                return


def watching(command_timeout: float, on_stall: Callable[[Stall], None]) -> Watchdog:
    """A watchdog for work whose commands time out after `command_timeout` seconds: it fires
    `SLACK_S` later, so the engine's own stall error, where it can raise one, comes first."""
    return Watchdog(command_timeout + SLACK_S, on_stall)


def kill_descendants() -> None:
    """SIGKILL every process below this one (rank processes, helpers): a fatal signal ends
    even a wait on a dead FUSE server."""

    for pid in _descendants(os.getpid())[1:]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# ------------------------------------------------------------------ the supervisor

_REPORT_FD: int | None = None  # in a supervised child: where it says its exit status
REAP_S = 0.5  # how long the supervisor waits for a child that said it is done to finish exiting


PR_SET_PDEATHSIG = 1


def bind_to_parent(parent: int) -> None:
    """This process dies (SIGKILL) when its parent `parent` ends, however it ends (kill -9,
    the OOM killer): PR_SET_PDEATHSIG, which the kernel fires when the thread that started
    this process ends, so only the main thread of a qual process starts children. Where the
    parent is gone already (it died before this call), this process ends now."""

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def dies_with_me() -> Callable[[], None]:
    """A Popen `preexec_fn`: the child qual starts (a checkpoint rank, the GNN gather server,
    mkfs) dies with this process, so no process outlives its qual."""
    parent = os.getpid()
    return lambda: bind_to_parent(parent)


def supervised(main: Callable[[], int]) -> int:
    """Run `main` in a child process and return its exit status, so that the command the user
    waits for always ends: a child whose threads sit in calls on dead storage cannot finish
    exiting (a FUSE request the server has read is waited for even through SIGKILL), but it
    says its status on a pipe first (`exit_now`), and this process returns it and leaves the
    child to the kernel, which reaps it once the storage answers or its connection is gone.
    The child has a process group of its own; Ctrl-C, SIGTERM and SIGHUP reach it through
    this process (once each), and it dies with this process."""
    import select
    import sys

    global _REPORT_FD
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: the command itself
        os.close(r)
        os.setpgid(0, 0)
        bind_to_parent(parent)
        _REPORT_FD = w
        code = 1
        try:
            code = main()
        except SystemExit as e:  # as the interpreter would end: argparse's errors, sys.exit
            if isinstance(e.code, int) or e.code is None:
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            exit_now(code)
    os.close(w)
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except OSError:
            pass
    previous = {sig: signal.signal(sig, forward) for sig in forwarded}
    try:
        said = b""
        while True:
            chunk = os.read(r, 64)
            if not chunk:
                break
            said += chunk
        code = int(said) if said.strip().isdigit() else None
        deadline = time.monotonic() + REAP_S
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status) if code is None else code
            if code is not None and time.monotonic() > deadline:
                return code  # it said its status and cannot finish exiting: leave it
            select.select([], [], [], 0.05)
    finally:
        os.close(r)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_now(code: int) -> None:
    """End this process with `code` at once, whatever its other threads are doing; in a
    supervised child, tell the supervisor first."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if _REPORT_FD is not None:
        try:
            os.write(_REPORT_FD, str(int(code)).encode())
            os.close(_REPORT_FD)
        except OSError:
            pass
    # a process whose threads cannot finish exiting keeps its descriptors: whoever reads this
    # command's output through a pipe (CI, subprocess) would wait for it. Every pipe, socket
    # and terminal it holds (standard output and the copies pytest's capture keeps) closes
    # now; files are left alone, since closing one on dead storage is itself a call that
    # does not return.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            what = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if fd > 2 and fd != null and what.startswith(("pipe:", "socket:", "/dev/pts/",
                                                      "/dev/tty")):
            try:
                os.close(fd)
            except OSError:
                pass
    os._exit(int(code))
