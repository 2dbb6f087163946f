"""Power cuts: what was flushed survives the drive losing its power (OCP AutoVal's drive data
integrity across a power cycle, docs/powercut.md).

A region between two guard bands is written at depth in chunks, every block one atomic write
unit stamped with its offset, this run's seed, the chunk write's sequence and a CRC32C; a flush
ends each chunk. Which sequence each chunk's last completed flush covered is kept on the host's
own disk, synced (state.py). At a seeded random moment in the profile's window the drive's power
is cut (cut.py), qual waits for the same drive to come back (bounded; the time is a figure) and
checks every block and the bands (check.py): a flushed block lost, a block torn inside its
atomic write unit, a byte changed outside the region each fail the drive, named by LBA; a block
the cut caught unflushed, found old or new, is counted. Several cycles a run. Writes go through
the target's guard (docs/ARCHITECTURE.md §4); a host that loses power too resumes from the
state (`qual run --resume`)."""

from __future__ import annotations

import errno
import random
import secrets
import threading
import time
from pathlib import Path

from qual import engine, units
from qual.errors import InvalidJob, QualError
from qual.exits import Exit
from qual.family import Family, Field, Flags, Outcome, Rates, SuiteTest, Work, declares
from qual.measurement import Measurement, Metric, Standing, measure
from qual.targets import Target
from qual.targets import nvme as nvme_cli
from qual.workloads.base import backend_field
from qual.workloads.powercut import check, cut
from qual.workloads.powercut.state import State

NAME = "powercut"
DEFAULT_STATE = "qual-powercut.state"
NEVER_LOST = Standing("max", 0, "qual: what a completed flush covered survives a power cut, "
                      "whole in its atomic write unit, and nothing outside the written region "
                      "changes (OCP AutoVal drive data integrity)")

METRICS = {m.name: m for m in (
    Metric("powercut_flushed_lost", "count", "lower", (),
           "blocks a completed flush covered that did not read back after a power cut"),
    Metric("powercut_torn", "count", "lower", (),
           "blocks (atomic write units) that read back part one write and part another"),
    Metric("powercut_outside_changed", "count", "lower", (),
           "blocks outside the written region that changed across the power cuts"),
    Metric("powercut_unflushed_old", "count", "higher", (),
           "blocks the cut caught unflushed, found as before the write (informational)"),
    Metric("powercut_unflushed_new", "count", "higher", (),
           "blocks the cut caught unflushed, found written (informational)"),
    Metric("powercut_return_time", "time", "lower", (),
           "the longest time from a drive-only cut to the namespace answering again"),
    Metric("powercut_cycles", "count", "higher", (), "power cuts survived and verified"),
)}

FIELDS = (
    Field("command", "text", default="auto", flag="--power-cut", run_flag="--qual-power-cut",
          help="how the drive's power is cut: the rig's command ({serial}, {device}, {pci} "
               "filled in), or qual's own: auto, slot (the PCIe slot's power), rescan (a hot "
               "removal and a rescan), loop (a loop device detached and attached again)"),
    Field("cycles", "count", default=3, maximum=1000, help="power cuts, each verified"),
    Field("size", "size", default="1 GiB", minimum=4096, help="bytes written between the cuts"),
    Field("flush_every", "size", default="64 MiB", minimum=512,
          help="bytes written between two flushes"),
    Field("queue_depth", "count", default=32, maximum=engine.MAX_QUEUE_DEPTH,
          help="writes in flight"),
    Field("cut_from", "duration", default="2 s", minimum=0,
          help="the earliest moment of a cut, after its cycle's writing starts"),
    Field("cut_until", "duration", default="10 s", minimum=0,
          help="the latest moment of a cut (the moment is drawn from the seed between the two)"),
    Field("return_timeout", "duration", default="120 s",
          help="the longest a cut, and the drive's return after it, may take"),
    Field("guard_band", "size", default="1 MiB", minimum=0,
          help="bytes around the region checked for change (each side)"),
    Field("report", "count", default=16, maximum=4096, help="bad blocks named, at most"),
    Field("state", "text", default=DEFAULT_STATE,
          help="the verify state on the host's disk (a suite keeps it beside its run record)"),
    backend_field(),
)


def _check(table: dict) -> list[tuple[str, str]]:
    problems = []
    if table["size"] % table["flush_every"]:
        problems.append(("size", f"{table['size']} is not a multiple of flush_every "
                         f"{table['flush_every']}"))
    if table["flush_every"] % 512:
        problems.append(("flush_every", "is not a multiple of 512 bytes"))
    if table["guard_band"] % 4096:
        problems.append(("guard_band", "is not a multiple of 4 KiB"))
    if table["cut_until"] < table["cut_from"]:
        problems.append(("cut_until", f"{table['cut_until']:g} s is before cut_from "
                         f"{table['cut_from']:g} s"))
    return problems


def atomic_unit(target: Target) -> tuple[int, str]:
    """The block the run stamps: the drive's atomic write unit where Identify says it (NVMe),
    else its logical block."""
    lba = target.align
    if target.identity.transport == "nvme":
        said = nvme_cli.atomic_write_unit(str(target.path), lba)
        if said:
            return max(said[0], lba), said[1]
    return lba, "the logical block size (no atomic write unit reported)"


def layout(target: Target, table: dict) -> dict:
    """Where the run writes and stamps, checked against the drive before any I/O."""
    block, source = atomic_unit(target)
    chunk, band = table["flush_every"], table["guard_band"]
    if chunk % block:
        raise InvalidJob(errno.EINVAL, f"flush_every {chunk} is not a multiple of the atomic "
                         f"write unit, {block} bytes ({source})", target=target.spec)
    if band % block:
        raise InvalidJob(errno.EINVAL, f"guard_band {band} is not a multiple of the atomic "
                         f"write unit, {block} bytes ({source})", target=target.spec)
    end = band + table["size"] + band
    if end > target.capacity:
        raise engine.NoSpace(errno.ENOSPC, f"the region and its guard bands need "
                             f"{units.format_size(end)}, {target.offer()}", target=target.spec)
    return {"offset": band, "size": table["size"], "chunk": chunk,
            "chunks": table["size"] // chunk, "block": block, "block_source": source,
            "lba_size": target.align, "band": band, "end": end}


class Writer(threading.Thread):
    """Chunk after chunk around the region, each written at depth and flushed, each logged
    before and after: until stopped, or until a write fails (the cut, or a fault)."""

    def __init__(self, run: Run, chunk: int, seq: int):
        super().__init__(name="qual-powercut-writer", daemon=True)
        self.runner, self.chunk, self.seq = run, chunk, seq
        self.ctl = engine.new_ctl()
        self.error: QualError | None = None
        self.stopping = False
        self.chunks = 0

    def run(self) -> None:
        try:
            while not self.stopping:
                self.runner.write_chunk(self.chunk, self.seq, self.ctl)
                self.chunks += 1
                self.chunk = (self.chunk + 1) % self.runner.begin["chunks"]
                self.seq += 1
        except QualError as e:
            self.error = e

    def stop(self) -> None:
        self.stopping = True
        self.ctl.cancel = 1


class Run:
    """One power-cut run on one drive: its layout, state and cycles."""

    def __init__(self, target: Target, table: dict, *, seed: int, progress, state: Path,
                 resume: bool):
        self.target, self.table, self.progress = target, table, progress
        self.cut = cut.resolve(table["command"], target)  # before any I/O
        self.drive = cut.Drive.of(target)
        self.rng = random.Random(seed)
        self.state = State(state)
        self.resume = resume and self.state.exists()
        self.cycles: list[dict] = []
        self.begin: dict = {}

    # ---- writing

    def write_chunk(self, chunk: int, seq: int, ctl=None) -> None:
        b = self.begin
        self.state.log("writing", chunk=chunk, seq=seq)
        engine.verify_blocks(str(self.target.path), op="write", block_size=b["block"],
                             queue_depth=self.table["queue_depth"],
                             offset=b["offset"] + chunk * b["chunk"], size=b["chunk"],
                             seed=b["seed"], seq=seq, align=b["lba_size"],
                             expect=self.target.inode, backend=self.table["backend"], ctl=ctl)
        self.state.log("flushed", chunk=chunk, seq=seq)

    def say(self, message: str, cycle: float) -> None:
        if self.progress:
            self.progress(f"powercut: {message}", cycle / (self.table["cycles"] + 1))

    # ---- the run

    def go(self) -> PowercutOutcome:
        if self.resume:
            replay = self.state.reopen()
            self.begin = replay.begin
            if replay.begin["serial"] != self.drive.serial:
                raise QualError(errno.EINVAL, f"{self.state.path} is the state of drive "
                                f"{replay.begin['serial']}, not {self.drive.serial}")
            self.cycles = [_cycle_doc(c) for c in replay.cycles]
            if replay.pending_cut is None:  # the host went down between two cycles
                self._bind(cut.await_return(self.drive, self.table["return_timeout"],
                                            since=time.monotonic(), spec=self.target.spec)[0])
            else:  # the host went down with the drive: verify that cut first
                self.say("verifying the cut the host did not live through", len(self.cycles))
                self._came_back(replay.pending_cut["cycle"], since=None)
        else:
            self._start()
        while len(self.cycles) < self.table["cycles"]:
            self._cycle(len(self.cycles) + 1)
        self.state.log("end")
        self.state.close()
        return PowercutOutcome(self._document(), self.target)

    def _start(self) -> None:
        lay = layout(self.target, self.table)
        self.target.ensure_writable(lay["end"])  # the guard, before the first byte
        bands = {}
        if lay["band"]:
            bands = {"before": [0, check.band_digests(str(self.target.path), 0, lay["band"],
                                                      lay["block"])],
                     "after": [lay["offset"] + lay["size"], check.band_digests(
                         str(self.target.path), lay["offset"] + lay["size"], lay["band"],
                         lay["block"])]}
        self.begin = {**lay, "serial": self.drive.serial, "device": str(self.target.path),
                      "seed": secrets.randbits(63), "bands": bands, "band_block": lay["block"],
                      "cut": self.cut.line, "how": self.cut.how,
                      "cycles": self.table["cycles"], "started": time.time()}
        self.state.start(self.begin)
        for chunk in range(lay["chunks"]):  # every block has a flushed sequence before a cut
            self.say(f"first pass: chunk {chunk + 1} of {lay['chunks']}", 0)
            self.write_chunk(chunk, chunk + 1)

    def _cycle(self, k: int) -> None:
        replay = self.state.replay()
        seq = replay.last_seq + 1
        if replay.writing:  # what the last cut left unflushed, rewritten before the clock starts
            self.write_chunk(replay.writing[0], seq)
            seq += 1
            replay = self.state.replay()
        moment = self.rng.uniform(self.table["cut_from"], self.table["cut_until"])
        writer = Writer(self, replay.next_chunk, seq)
        started = time.monotonic()
        writer.start()
        self.say(f"cycle {k}: writing, the cut in {moment:.1f} s", k - 1)
        while time.monotonic() - started < moment and writer.is_alive():
            time.sleep(0.02)
        if writer.error:  # before the cut: the drive's own failure
            raise writer.error
        # resolved again for the drive as it is now: one that came back under another name
        # is cut there (`{device}` at its old name would be another drive's now)
        self.cut = cut.resolve(self.table["command"], self.target)
        self.state.log("cut", cycle=k, at=time.time(), moment=round(moment, 3), how=self.cut.how)
        bound = self.table["return_timeout"]
        if self.cut.quiesce:  # nobody can take a loop device's power while it is written
            writer.stop()
            writer.join(bound)
        locked = self.target.let_go()
        self.say(f"cycle {k}: cutting the power ({self.cut.line})", k - 1)
        cut_at = time.monotonic()
        self.cut.run(bound)
        if not self.cut.quiesce:
            writer.join(max(0.0, cut_at + bound - time.monotonic()))
            if writer.is_alive() or writer.error is None:
                writer.stop()
                writer.join(engine.STOP_WAIT)
                raise cut.CutFailed(errno.EIO, f"the drive kept completing writes after "
                                    f"`{self.cut.line}` ended: the command did not cut its "
                                    "power", target=self.target.spec)
        self._came_back(k, since=cut_at, locked=locked,
                        interrupted=str(writer.error) if writer.error else None,
                        chunks=writer.chunks)

    def _came_back(self, k: int, *, since: float | None, locked: bool = True,
                   interrupted: str | None = None, chunks: int = 0) -> None:
        """The drive back after cycle k's cut, and every block checked; `since` None: the host
        went down too, so the return is not timed."""
        bound = self.table["return_timeout"]
        path, took = cut.await_return(self.drive, bound,
                                      since=time.monotonic() if since is None else since,
                                      spec=self.target.spec)
        seconds = None if since is None else round(took, 3)
        self.state.log("returned", cycle=k, seconds=seconds, device=str(path))
        if since is None:  # a new boot: the target was opened as it is now
            self._bind(path)
        else:
            self.target.rebind(path, lock=locked)
            self.target.ensure_writable(self.begin["end"])  # the guard again, as for any write
        replay = self.state.replay()
        self.say(f"cycle {k}: checking {units.format_size(self.begin['size'])}", k - 0.2)
        found = check.check_region(str(self.target.path), self.begin, replay.flushed,
                                   replay.writing, expect=self.target.inode,
                                   backend=self.table["backend"],
                                   queue_depth=self.table["queue_depth"])
        doc = found.as_dict(self.table["report"])
        self.state.log("verified", cycle=k, interrupted=interrupted, chunks=chunks,
                       unflushed_chunk=replay.writing, **doc)
        self.cycles.append(_cycle_doc({**doc, "cycle": k, "interrupted": interrupted,
                                       "returned": {"seconds": seconds, "device": str(path)}}))

    def _bind(self, path: Path) -> None:
        """After a host cut: the drive as this boot named it, the guard asked before a write."""
        if path != self.target.path:
            self.target.rebind(path, lock=self.target.let_go())
        self.target.ensure_writable(self.begin["end"])

    def _document(self) -> dict:
        b = self.begin
        totals = dict.fromkeys(check.KINDS, 0)
        for c in self.cycles:
            for kind, n in c["counts"].items():
                totals[kind] += n
        return {"device": b["device"], "serial": b["serial"],
                "cut": {"how": b["how"], "command": b["cut"]},
                "atomic_unit": {"bytes": b["block"], "source": b["block_source"]},
                "region": {"offset": b["offset"], "size": b["size"], "guard_band": b["band"]},
                "flush_every": b["chunk"], "seed": b["seed"], "state": str(self.state.path),
                "cycles": self.cycles, "totals": totals}


def _cycle_doc(c: dict) -> dict:
    returned = c.get("returned") or {}
    return {"cycle": c["cycle"], "return_s": returned.get("seconds"),
            "device": returned.get("device"), "interrupted": c.get("interrupted"),
            "counts": c["counts"], "bad": [{**b, "cycle": c["cycle"]} for b in c["bad"]],
            "blocks": c["blocks"]}


class PowercutOutcome(Outcome):
    """The cycles of one run: their counts, return times and the blocks they name."""

    def __init__(self, doc: dict, target: Target):
        self.doc, self.target = doc, target

    def bad(self) -> list[dict]:
        return [b for c in self.doc["cycles"] for b in c["bad"]]

    def measurements(self, section: str | None = None) -> list[Measurement]:
        d = self.doc
        ctx = {"target": str(self.target.path), "path": "O_DIRECT", "cut": d["cut"],
               "atomic_unit": d["atomic_unit"], "region": d["region"],
               "flush_every": d["flush_every"], "bad": self.bad(),
               "return_s": [c["return_s"] for c in d["cycles"]]}
        t = d["totals"]
        timed = [c["return_s"] for c in d["cycles"] if c["return_s"] is not None]
        # each block lost, torn or changed heads the report's first page, once
        named = [[b["kind"].upper().replace("_", " "),
                  f"LBA {b['lba']} after power cut {b['cycle']}: {b['what']}"] for b in self.bad()]
        found = [
            measure(NAME, METRICS["powercut_flushed_lost"], {}, t["lost"],
                    context={**ctx, "attention": named}, standing=NEVER_LOST),
            measure(NAME, METRICS["powercut_torn"], {}, t["torn"], context=ctx,
                    standing=NEVER_LOST),
            measure(NAME, METRICS["powercut_outside_changed"], {}, t["outside_changed"],
                    context=ctx, standing=NEVER_LOST),
            measure(NAME, METRICS["powercut_unflushed_old"], {}, t["unflushed_old"], context=ctx),
            measure(NAME, METRICS["powercut_unflushed_new"], {}, t["unflushed_new"], context=ctx),
            measure(NAME, METRICS["powercut_cycles"], {}, len(d["cycles"]), context=ctx),
        ]
        if timed:
            found.append(measure(NAME, METRICS["powercut_return_time"], {}, max(timed),
                                 context=ctx))
        return found

    def document(self) -> dict:
        return self.doc

    def lines(self) -> list[str]:
        d = self.doc
        out = [f"powercut on {d['device']} (serial {d['serial']}): {len(d['cycles'])} cuts by "
               f"{d['cut']['how']} (`{d['cut']['command']}`), atomic write unit "
               f"{d['atomic_unit']['bytes']} bytes ({d['atomic_unit']['source']})"]
        for c in d["cycles"]:
            back = "host cut: not timed" if c["return_s"] is None else f"back in {c['return_s']:.2f} s"
            n = c["counts"]
            out.append(f"  cycle {c['cycle']}: {back}, {c['blocks']} blocks checked: "
                       f"{n['lost']} lost, {n['torn']} torn, {n['outside_changed']} changed "
                       f"outside; unflushed found old {n['unflushed_old']}, new "
                       f"{n['unflushed_new']}")
            out += [f"    LBA {b['lba']}: {b['what']}" for b in c["bad"]]
        return out

    def exit_status(self) -> int:
        t = self.doc["totals"]
        return Exit.FAIL if t["lost"] or t["torn"] or t["outside_changed"] else Exit.PASS


def run(target: Target, table: dict, *, seed: int = 1, progress=None, state: Path | None = None,
        resume: bool = False) -> PowercutOutcome:
    """`cycles` power cuts on the drive, each verified; `state` where the verify state goes
    (default: the table's), `resume` to verify first the cut a host cut left pending."""
    return Run(target, table, seed=seed, progress=progress,
               state=Path(state or table["state"]), resume=resume).go()


def _plan(table: dict, test: str, param, rates: Rates) -> list[Work]:
    """The first pass, then each cycle's writing up to its cut, the cut, the return and a read
    of the region; the longest a cycle may take is its window's end and two bounds."""
    if not declares(TESTS, test):
        return []
    size, n = table["size"], table["cycles"]
    check_s = size / rates.read_bw
    writing = (table["cut_from"] + table["cut_until"]) / 2  # a cycle's, on average
    seconds = size / rates.write_bw + n * (writing + cut.OFF_S + check_s)
    longest = seconds + n * (table["cut_until"] - writing + 2 * table["return_timeout"])
    command = table["command"]
    how = cut.WORDS.get(command, "the rig's command ({serial}, {device}, {pci} filled in)")
    return [Work("powercut", seconds, bytes_written=int(size + n * writing * rates.write_bw),
                 bytes_read=n * size, space=size + 2 * table["guard_band"],
                 what="the power-cut region and its guard bands (powercut.size, guard_band)",
                 longest=longest,
                 says=(f"cuts the drive's power {n} times with: {command} ({how})",))]


TESTS = (SuiteTest("flushed_data_survives_power_cuts", "data integrity across power cuts",
                   "Every block a completed flush covered reads back after each power cut, none "
                   "torn inside the drive's atomic write unit, nothing outside the region "
                   "changed, and the drive came back within its bound.",
                   run=lambda target, table, _value, *, seed, progress, state, resume: run(
                       target, table, seed=seed, progress=progress, state=state,
                       resume=resume),
                   destructive=lambda value: True, keeps_state=True),)


FAMILY = Family(name=NAME, description="data integrity across power cuts: what was flushed "
                "survives", fields=FIELDS, metrics=METRICS, check=_check,
                cells=lambda table: list(METRICS), run=run, plan=_plan,
                flags=Flags(keeps=True), restarts_drive=True, tests=TESTS)
