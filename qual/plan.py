"""The plan of a run, made before its first I/O (docs/ARCHITECTURE.md, "A plan before I/O"):
every test the run will make with the bytes it writes and reads, its estimated seconds and where
it runs (raw on the device, on the filesystem qual makes there, or in a file), and every reason
the run cannot go ahead, each named once. The families say what their tests do (Family.plan);
this module adds it up, checks it against the target and the guard, and refines its rates from
the last run on the same host."""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass, field, replace

from qual.family import Rates, Settings, host_memory
from qual.stats import median
from qual.targets import SPACE_RESERVE, Target, guard_refusals, scratch
from qual.targets.filesystem import usable_room
from qual.units import format_duration, format_size

PER_TEST_S = 0.02  # pytest's own time around a test: set-up, the recorder, the Allure files
CALIBRATION_LIMITS = (0.25, 4.0)  # a past run never moves an estimate by more than this
# A test's time limit: this many times the most its plan says it may take, plus this many
# seconds. Generous on purpose: a stall is the watchdog's to catch within the command timeout;
# the limit only ends a test that keeps answering but never finishes.
TIME_LIMIT = (4.0, 600.0)


CPU_PROBE_S = 0.2  # how long the plan watches how much of a core this process gets


def cpu_share(seconds: float = CPU_PROBE_S) -> float:
    """The share of a core a busy loop gets here now (1.0 on an idle host): what the host's
    neighbours leave qual, for the CPU-bound part of each estimate (Rates.cpu)."""
    wall0, cpu0 = time.monotonic(), time.process_time()
    while time.monotonic() - wall0 < seconds:
        sum(range(10_000))
    return min(1.0, max(0.05, (time.process_time() - cpu0) / (time.monotonic() - wall0)))


def time_limit(estimate_max_s: float) -> float:
    factor, margin = TIME_LIMIT
    return factor * estimate_max_s + margin


@dataclass(frozen=True)
class Selected:
    """A test the run selected: its pytest node id, its family, its function and parameter,
    and whether it is marked destructive."""

    id: str
    family: str
    test: str
    param: object = None
    destructive: bool = False
    repetition: int | None = None  # r of a test the suite repeats (its id ends -rN)


@dataclass
class PlannedTest:
    id: str
    family: str
    where: str  # "raw", "filesystem" (qual's, on a raw namespace) or "file"
    bytes_written: int
    bytes_read: int
    estimate_s: float
    space: int  # the most room it needs on the target at once
    estimate_max_s: float  # the most it may take (a steady-state test at its round limit)
    model_s: float  # the estimate before the last run's scaling (what the next run scales)
    time_limit_s: float = 0.0  # the most the run lets it take (time_limit of estimate_max_s)
    says: list[str] = field(default_factory=list)  # its work's own words (a command it runs)

    def __post_init__(self):
        self.time_limit_s = self.time_limit_s or time_limit(self.estimate_max_s)


@dataclass
class Plan:
    target: str
    kind: str
    profile: str
    tests: list[PlannedTest]
    refusals: list[str]
    filesystem: dict | None = None  # what qual makes on a raw namespace for the file families
    rates: dict = field(default_factory=dict)
    basis: str = "model"
    fitted: dict = field(default_factory=dict)  # family -> {"changes", "caveat"} (--qual-fit)
    left_out: list[str] = field(default_factory=list)  # families a -k/-m subset cut into

    @property
    def total_estimate_s(self) -> float:
        return sum(t.estimate_s for t in self.tests)

    @property
    def total_estimate_max_s(self) -> float:
        return sum(t.estimate_max_s for t in self.tests)

    def as_dict(self) -> dict:
        return {"target": self.target, "kind": self.kind, "profile": self.profile,
                "tests": [asdict(t) for t in self.tests],
                "bytes_written": sum(t.bytes_written for t in self.tests),
                "bytes_read": sum(t.bytes_read for t in self.tests),
                "total_estimate_s": self.total_estimate_s,
                "total_estimate_max_s": self.total_estimate_max_s, "refusals": self.refusals,
                "filesystem": self.filesystem, "rates": self.rates, "basis": self.basis,
                "fitted": self.fitted, "left_out": self.left_out}

    def lines(self) -> list[str]:
        return plan_lines(self.as_dict())


def plan_lines(plan: dict) -> list[str]:
    """A plan (Plan.as_dict()) as a person reads it: a line per test, the total, the
    refusals."""
    tests = plan["tests"]
    width = max((len(t["id"]) for t in tests), default=10)
    out = [f"plan: {len(tests)} tests of profile {plan['profile']} on {plan['target']} "
           f"({plan['kind']})"]
    fs = plan.get("filesystem")
    if fs:
        out.append(f"the file families run on a {fs['type']} filesystem qual makes on the device "
                   f"(mkfs.{fs['type']} {' '.join(fs['options'])}), unmounted and erased at "
                   "the end")
    out.append(f"{'test':<{width}}  {'where':<10}  {'writes':>9}  {'reads':>9}  estimate")
    for t in tests:
        most = f" (at most {format_duration(t['estimate_max_s'])})" \
            if t["estimate_max_s"] > 1.5 * t["estimate_s"] else ""
        out.append(f"{t['id']:<{width}}  {t['where']:<10}  {format_size(t['bytes_written']):>9}"
                   f"  {format_size(t['bytes_read']):>9}  {format_duration(t['estimate_s'])}"
                   + most)
        out += [f"  {line}" for line in t.get("says", [])]
    most = f", at most {format_duration(plan['total_estimate_max_s'])} if every steady-state " \
        "test runs to its round limit" \
        if plan["total_estimate_max_s"] > 1.05 * plan["total_estimate_s"] else ""
    factor, margin = TIME_LIMIT
    out.append(f"each test's time limit: {factor:g} x its most + {format_duration(margin)} "
               "(stalls are the watchdog's, within the command timeout)")
    out.append(f"total: {format_size(plan['bytes_written'])} written, "
               f"{format_size(plan['bytes_read'])} read, about "
               f"{format_duration(plan['total_estimate_s'])}{most} ({plan['basis']})")
    for name, fit in plan.get("fitted", {}).items():
        out.append(f"CAVEAT {name}: {fit['caveat']}")
    if plan["refusals"]:
        out.append(f"refused ({len(plan['refusals'])}): nothing will be written")
        out += [f"  {r}" for r in plan["refusals"]]
    return out


def calibration(previous: dict | None, spec: str) -> tuple[dict[str, float], str]:
    """How much longer than its model the last run on this host and target took: per test
    (its measured seconds over its model estimate) and per family (the median test's ratio,
    for tests the last run did not make: one slow steady state moves nothing), keyed by test
    id and by family name; and where that came from."""
    if not previous or previous.get("host", {}).get("hostname") != socket.gethostname() or \
            (previous.get("plan") or {}).get("target") != spec:
        return {}, "model"
    planned = {t["id"]: t for t in (previous.get("plan") or {}).get("tests", ())}
    lo, hi = CALIBRATION_LIMITS
    factors: dict[str, float] = {}
    ratios: dict[str, list[float]] = {}
    for t in previous.get("tests", ()):
        p = planned.get(t["nodeid"])
        model = p and p.get("model_s", p["estimate_s"])
        if model and model >= 0.5 and t["outcome"] in ("passed", "failed"):
            factors[t["nodeid"]] = min(hi, max(lo, t["duration_s"] / model))
            ratios.setdefault(p["family"], []).append(factors[t["nodeid"]])
    families = {f: median(r) for f, r in ratios.items()}
    if not families:
        return {}, "model"
    shown = ", ".join(f"{f} x{v:.2f}" for f, v in sorted(families.items()))
    return {**families, **factors}, ("model, scaled test by test by the last run on this host "
                                     f"(families: {shown})")


def make_plan(selected: list[Selected], target: Target, profile, families: dict, *,
              filesystem: dict | None = None, keep: bool = False, fit: bool = False,
              previous: dict | None = None, rates: Rates | None = None,
              repeats: int = 1) -> Plan:
    """The plan of `selected` on `target`: `filesystem` is what qual makes on a raw namespace
    for the file families ({"type", "options"}); `keep`: what the families make stays to the
    end (--qual-keep-scratch), so their room adds up; `fit`: a family whose tests need more
    room than the target offers is scaled down to fit (--qual-fit), and says so; `previous`:
    the last run record in the results folder, whose durations refine the estimates; `repeats`:
    how many times each figure is measured."""
    rates = rates or Rates(cpu=1 / cpu_share())
    factors, basis = calibration(previous, target.spec)
    chosen = [s for s in selected if s.family in families and profile.table(s.family)]
    block = target.kind == "block"
    needs_fs = block and any(families[s.family].filesystem for s in chosen)
    rooms = _Rooms(target, filesystem["type"] if needs_fs and filesystem else None)
    tables = {s.family: profile.table(s.family) for s in chosen}
    fitted = {}
    if fit:
        for name in tables:
            mine = [s for s in chosen if s.family == name]
            got = _fit(families[name], tables[name], mine, replace(rates, room=rooms.room(
                families[name])), target.spec)
            if got:
                tables[name], fitted[name] = got[0], {"changes": got[1], "caveat": got[2]}
    done: set[tuple[str, int]] = set()
    filled = _filled(target)
    tests, short, memory = [], {}, {}
    have = host_memory()
    for s in chosen:
        family = families[s.family]
        where = "file" if not block else "filesystem" if family.filesystem else "raw"
        room = rooms.room(family)
        written = read = space = 0
        seconds = longest = PER_TEST_S
        works = family.plan(tables[s.family], s.test, s.param, replace(rates, room=room))
        says = [line for w in works for line in w.says]
        # what qual writes before the test's first read: a file target's scratch file; on a
        # block device, the region a raw test reads (blocks this run wrote)
        fills = where == "file" and not family.filesystem or \
            where == "raw" and any(w.bytes_read for w in works)
        for w in works:
            if have is not None and w.memory > have:
                memory.setdefault((s.family, w.what, w.memory), []).append(s.id)
            if w.space:
                space = max(space, w.space)
                if room is not None and w.space > room:
                    short.setdefault((s.family, w.what, w.space, rooms.offer(family)),
                                     []).append(s.id)
            key = (w.key, s.repetition or 0 if w.repeated else 0)
            if key in done:
                continue
            done.add(key)
            times = repeats if w.repeated and s.repetition is None else 1
            written, read = written + times * w.bytes_written, read + times * w.bytes_read
            seconds += times * w.seconds
            longest += times * (w.seconds if w.longest is None else w.longest)
            if fills and w.space > filled:
                fill = w.space - filled  # written once, before it is read
                written += fill
                seconds += fill / rates.write_bw
                longest += fill / rates.write_bw
                filled = w.space
        factor = factors.get(s.id, factors.get(s.family, 1.0))
        tests.append(PlannedTest(s.id, s.family, where, written, read, seconds * factor, space,
                                 max(seconds * factor, longest), seconds, says=says))
    refusals = _space_refusals(short, profile)
    refusals += [f"does not fit in memory: {what} needs {format_size(need)} of host memory; "
                 f"this host has {format_size(have)} available (tests: {', '.join(ids)})"
                 for (family, what, need), ids in memory.items()]
    if keep and needs_fs:
        most: dict[str, int] = {}  # a family's tests share its data: its largest need counts
        for t in tests:
            if t.where == "filesystem":
                most[t.family] = max(most.get(t.family, 0), t.space)
        total = sum(most.values())
        if rooms.fs_room is not None and total > rooms.fs_room:
            refusals.append(f"--qual-keep-scratch keeps every file family's data: "
                            f"{format_size(total)} together, more than the "
                            f"{format_size(rooms.fs_room)} qual's filesystem offers")
    if needs_fs and filesystem:
        refusals += _filesystem_refusals(filesystem["type"])
    if block and (needs_fs or any(s.destructive or t.bytes_written
                                  for s, t in zip(chosen, tests))):
        for r in guard_refusals(str(target.path), target.identity,
                                allow_destructive=target.allow_destructive,
                                confirm_serial=target.confirm_serial,
                                flags=target.consent_flags):
            refusals.append(f"guard: {r.rule}: {r.detail}")
    return Plan(target.spec, target.kind, profile.name, tests, refusals,
                filesystem if needs_fs else None,
                {k: v for k, v in asdict(rates).items() if k != "room"}, basis, fitted)


MKFS_PACKAGES = {"ext4": "e2fsprogs", "xfs": "xfsprogs"}


def _filesystem_refusals(kind: str) -> list[str]:
    """What qual needs to make and mount its filesystem: the mkfs tool, and root (a private
    mount namespace, mount itself)."""
    out = []
    if shutil.which(f"mkfs.{kind}") is None:
        out.append(f"qual's {kind} filesystem for the file families needs mkfs.{kind} "
                   f"(Debian: apt-get install {MKFS_PACKAGES[kind]})")
    if os.geteuid() != 0:
        out.append("qual's filesystem for the file families is made and mounted as root "
                   "(mkfs, a private mount namespace): run as root, or qualify a directory on "
                   "the drive")
    return out


class _Rooms:
    """The room a family has on the target, and how a refusal says it: a raw family the
    target's capacity; a file family qual's filesystem's usable room on a block device, or the
    free space (less qual's reserve) beside a file target."""

    def __init__(self, target: Target, fs_kind: str | None):
        self.target = target
        self.capacity = target.capacity
        self.fs_room = usable_room(self.capacity, fs_kind) if fs_kind else None
        self.file_room = None if target.kind == "block" else _free(target)

    def room(self, family) -> int | None:
        if not family.filesystem:
            return self.capacity
        return self.fs_room if self.target.kind == "block" else self.file_room

    def offer(self, family) -> str:
        if not family.filesystem:
            return self.target.offer()
        if self.target.kind == "block":
            return (f"qual's filesystem on {self.target.spec} would offer "
                    f"{format_size(self.fs_room or 0)}")
        return _file_offer(self.target, self.file_room or 0)


def _fit(family, table: dict, tests: list[Selected], rates: Rates,
         spec: str) -> tuple[dict, dict, str] | None:
    """The family's table scaled down to the room, what changed, and the caveat its figures
    carry; None when it fits already or cannot be made to."""
    def need(t: dict) -> int:
        return max((w.space for s in tests for w in family.plan(t, s.test, s.param, rates)),
                   default=0)

    room, before = rates.room, need(table)
    if room is None or before <= room:
        return None
    changes = family.fit(table, room, before)
    if not changes:
        return None
    smaller = Settings({**table, **changes})
    if family.check(smaller) or need(smaller) > room:
        return None
    kinds = {f.name: f.kind for f in family.fields}
    shown = ", ".join(f"{family.name}.{k} {_show(table.get(k), kinds.get(k))} -> "
                      f"{_show(v, kinds.get(k))}" for k, v in changes.items())
    return smaller, changes, (f"scaled to fit {spec} (--qual-fit): {shown}; the figure comes "
                              f"from less than the profile asks ({format_size(before)} needed, "
                              f"{format_size(room)} offered)")


def _show(value, kind: str | None) -> str:
    if value is None:
        return "(default)"
    return format_size(value) if kind == "size" else f"{value:.4g}" \
        if isinstance(value, float) else str(value)


def _space_refusals(short: dict, profile) -> list[str]:
    out = []
    for (family, what, need, offer), ids in short.items():
        decided = [c.id for c in profile.criteria if c.family == family]
        judged = f"; unjudged then: {', '.join(decided)}" if decided else ""
        out.append(f"does not fit: {what} needs {format_size(need)}; {offer} (tests: "
                   f"{', '.join(ids)}){judged}. --qual-fit scales it down to fit")
    return out


def _file_offer(target: Target, room: int) -> str:
    free = shutil.disk_usage(_folder(target)).free
    return (f"{_folder(target)} has {format_size(free)} free, of which qual keeps "
            f"{format_size(SPACE_RESERVE)} in reserve: {format_size(room)} usable")


def _folder(target: Target):
    return target.directory if target.directory.exists() else target._existing()


def _free(target: Target) -> int:
    return max(0, shutil.disk_usage(_folder(target)).free - SPACE_RESERVE)


def _filled(target: Target) -> int:
    """Bytes of the scratch file already written (a kept one is reused)."""
    if target.kind == "block":  # a qualification's reads read blocks the run wrote first
        return target.written if target.fill_reads else 1 << 62
    owned = scratch.prove(target.path) if target.path.exists() else None
    return owned.written if owned else 0

