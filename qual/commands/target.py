"""What every command that runs on a target shares (`qual io` and the family commands): the
target's flags, the settings' problems said per flag, progress with an ETA on stderr, the
watchdog over the command, and the one path a command takes on a target (locked, the work
run, what it made removed unless kept)."""

from __future__ import annotations

import sys
import time

from qual import units, watchdog
from qual.exits import Exit
from qual.flags import field_flags, flag_fields, flag_name
from qual.plugin.progress import INNER_INTERVAL_S, Inner
from qual.targets import DEFAULT_TARGET, Target


class Reporter:
    """Progress on stderr with the share done and an ETA where the family says how far it
    is: the first line at once, then at most one every 10 s (the rig-scale rule; on a terminal
    one line rewritten in place), the last one held back shown when the run ends; silent with
    -q. `say` is for the command's own lines, shown at once. The ETA is paced from the first
    share reported, so set-up before it (a dataset generated, a store built) does not skew
    it."""

    def __init__(self, command: str, quiet: bool, interval: float = INNER_INTERVAL_S):
        self.command, self.quiet = command, quiet
        self.started = time.monotonic()
        self.first: tuple[float, float] | None = None  # (time, share) of the first share
        terminal = sys.stderr.isatty()
        self.paced = Inner(self.say, self._rewrite if terminal else None,
                           lambda: print(file=sys.stderr, flush=True), interval=interval)

    def __call__(self, message: str, done: float | None = None) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        where = f"{units.format_duration(now - self.started)} elapsed"
        if done is not None and done < 1:
            if self.first is None:
                self.first = (now, done)
            t0, d0 = self.first
            if done > d0:
                where += f", ETA {units.format_duration((now - t0) * (1 - done) / (done - d0))}"
        share = f"[{done * 100:3.0f} %] " if done is not None else ""
        self.paced(f"{share}{message} ({where})")

    def say(self, line: str) -> None:
        if not self.quiet:
            print(f"qual {self.command}: {line}", file=sys.stderr, flush=True)

    def _rewrite(self, line: str) -> None:
        print(f"\r\x1b[Kqual {self.command}: {line}", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        """The run ended: the line in place finished, or the last line held back shown."""
        if not self.quiet:
            self.paced.close()


def add_target_flags(p, default: str) -> None:
    """The flags of every command that runs on a target: the target (`default`: where qual
    makes its scratch file without one), the guard's two, --json and -q."""
    p.add_argument("--target", default=None,
                   help=f"file, directory or block device (default: {default})")
    p.add_argument("--json", action="store_true", help="print a JSON document")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--allow-destructive", action="store_true",
                   help="allow writes to a block device (the safety guard still applies)")
    p.add_argument("--confirm-serial", default=None, help="serial of the device to overwrite")


def said_problems(name: str, fields, problems) -> int:
    """Each problem of a command's settings on its own line, a flag's by the flag a user
    typed (`qual NAME: error: --bs: …`), a profile's by file and key: a usage error, before
    anything is touched."""
    by_key = dict(flag_fields(fields))
    for where, key, problem in problems:
        leaf = key.split(".", 1)[1] if "." in key else None
        shown = (field_flags(leaf, by_key[leaf])[0] if leaf in by_key else flag_name(leaf)) \
            if where == "flags" and leaf else f"{where}:{key}"
        print(f"qual {name}: error: {shown}: {problem}", file=sys.stderr)
    return Exit.USAGE


def watched(name: str, target: str | None, command_timeout: float) -> watchdog.Watchdog:
    """A watchdog over a command on a target (docs/ARCHITECTURE.md §4): when a call on the
    storage does not return, it says which and ends the command with exit 1 from its own
    thread, touching the target no more (`qual clean` removes what was left, later)."""
    def stalled(stall: watchdog.Stall) -> None:
        print(f"qual {name}: error: Stalled: {stall}", file=sys.stderr)
        print(f"qual {name}: nothing more was done on {target or DEFAULT_TARGET}; what this "
              "command made there stays until `qual clean` removes it, once the storage "
              "answers", file=sys.stderr)
        watchdog.kill_descendants()
        watchdog.exit_now(Exit.FAIL)
    return watchdog.watching(command_timeout, stalled)


def on_target(target: Target, work, *, say, keep: bool, lock: bool = True, remove=None):
    """The one path every command takes on a target once it is opened (the guard's flags
    given): locked (unless others share it, or it is only read), the work run, what it made
    removed afterwards unless kept (`remove(target)` first: a family's own files), and each
    removal said."""
    if lock:
        target.lock()
    try:
        return work(target)
    finally:
        if remove and not keep:
            remove(target)
        if lock:
            target.unlock()
        if not keep:
            for path in target.cleanup():
                say(f"removed {path} (--keep keeps it)")


def open_target(spec: str | None, args) -> Target:
    return Target(spec, allow_destructive=args.allow_destructive,
                  confirm_serial=args.confirm_serial)


