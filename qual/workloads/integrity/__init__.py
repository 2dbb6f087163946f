"""Data integrity: verification blocks (offset, run seed, sequence, CRC32C in every block) laid
over the profile's region in sequential or random order, overwritten by a newer generation,
then read back and checked, so corrupted, stale (lost write), misdirected and unreadable
(a medium error) blocks are found and named. Writes go through the target's guard (docs/ARCHITECTURE.md §4)."""

from __future__ import annotations

import secrets

from qual import engine, honesty, units
from qual.exits import Exit
from qual.workloads.base import backend_field
from qual.family import Family, Field, Outcome, Rates, SuiteTest, Work, declares
from qual.measurement import Measurement, Metric, Param, measure, measurement_id
from qual.targets import Target

NAME = "integrity"
PATTERNS = ("sequential", "random")
_PATTERN = Param("pattern", "name")

METRICS = {m.name: m for m in (
    Metric("integrity_bad_blocks", "count", "lower", (_PATTERN,),
           "blocks that did not read back as last written: corrupted, foreign, misdirected, "
           "stale, or unreadable (the drive answered the read with an error)"),
    Metric("integrity_verified", "size", "higher", (_PATTERN,), "bytes read back and checked"),
    Metric("integrity_write_bw", "bandwidth", "higher", (_PATTERN,),
           "verification blocks written per second, durable"),
    Metric("integrity_read_bw", "bandwidth", "higher", (_PATTERN,),
           "verification blocks read and checked per second"),
)}

FIELDS = (
    Field("size", "size", default="1 GiB", minimum=4096, help="bytes verified, from offset 0"),
    Field("block_size", "size", default="128K", minimum=512, help="bytes per verification block"),
    Field("queue_depth", "count", default=16, maximum=engine.MAX_QUEUE_DEPTH,
          help="blocks in flight"),
    Field("patterns", "choices", default=list(PATTERNS), choices=PATTERNS,
          help="write orders checked (sequential, random)"),
    Field("generations", "count", default=2, maximum=16,
          help="writes of the region before the check: from 2 on, a lost write shows as stale"),
    Field("report", "count", default=8, maximum=1024, help="bad blocks described, at most"),
    backend_field(),
)


def _check(table: dict) -> list[tuple[str, str]]:
    problems = []
    if table["block_size"] % 512:
        problems.append(("block_size", "is not a multiple of 512 bytes"))
    elif table["size"] % table["block_size"]:
        problems.append(("size", f"{table['size']} is not a multiple of the block size "
                         f"{table['block_size']}"))
    return problems


def _cells(table: dict) -> list[str]:
    return [measurement_id(METRICS[m], {"pattern": p}) for p in table["patterns"]
            for m in METRICS]


def run_pattern(target: Target, table: dict, pattern: str, *, seed: int | None = None,
                faults=(), progress=None) -> dict:
    """Write the region `generations` times in `pattern` order, then check every block."""
    size, bs = table["size"], table["block_size"]
    if bs % target.align:
        raise engine.InvalidJob(22, f"block size {bs} is not a multiple of the target's "
                                f"logical block size {target.align}", target=target.spec)
    target.ensure_writable(size)  # the guard, before the first byte
    seed = secrets.randbits(63) if seed is None else seed  # this run's blocks are its own
    common = dict(block_size=bs, queue_depth=table["queue_depth"], offset=0, size=size,
                  seed=seed, random=pattern == "random", align=target.align,
                  backend=table["backend"], faults=tuple(faults), expect=target.inode)
    path = str(target.path)
    writes = []
    passes = table["generations"] + 1
    for g in range(1, table["generations"] + 1):
        if progress:
            progress(f"integrity {pattern}: writing generation {g}/{table['generations']}",
                     (g - 1) / passes)
        writes.append(engine.verify_blocks(path, op="write", seq=g, **common))
    if progress:
        progress(f"integrity {pattern}: checking {size} bytes", (passes - 1) / passes)
    check = engine.verify_blocks(path, op="read", seq=table["generations"],
                                 max_report=table["report"], **common)
    return {"pattern": pattern, "seed": seed, "writes": writes, "check": check}


def measurements(result: dict, target: Target) -> list[Measurement]:
    check, writes = result["check"], result["writes"]
    p = {"pattern": result["pattern"]}
    ctx = {"target": str(target.path), "backend": check.backend, "path": "O_DIRECT",
           "seed": result["seed"], "generations": len(writes), "blocks": check.blocks,
           "counts": check.counts, "bad": [b.describe() for b in check.bad]}
    write_bw = sum(w.bytes for w in writes) / sum(w.elapsed for w in writes)
    honesty.check_link(write_bw, target.identity, target.spec, "verification writes")
    honesty.check_link(check.bw, target.identity, target.spec, "verification reads")
    return [
        measure(NAME, METRICS["integrity_bad_blocks"], p, check.bad_blocks, context=ctx),
        measure(NAME, METRICS["integrity_verified"], p, check.bytes, context=ctx),
        measure(NAME, METRICS["integrity_write_bw"], p, write_bw, context=ctx),
        measure(NAME, METRICS["integrity_read_bw"], p, check.bw, context=ctx),
    ]


class IntegrityOutcome(Outcome):
    """Every pattern's writes and check."""

    def __init__(self, results: list[dict], target: Target):
        self.results = results
        self.target = target

    def measurements(self) -> list[Measurement]:
        return [m for r in self.results for m in measurements(r, self.target)]

    def document(self) -> dict:
        return {"patterns": [{
            "pattern": r["pattern"], "seed": r["seed"], "generations": len(r["writes"]),
            "backend": r["check"].backend, "blocks": r["check"].blocks,
            "bytes_verified": r["check"].bytes, "bad_blocks": r["check"].bad_blocks,
            "counts": r["check"].counts, "bad": [b.describe() for b in r["check"].bad],
            "write_bw_bytes": sum(w.bytes for w in r["writes"]) /
            sum(w.elapsed for w in r["writes"]),
            "read_bw_bytes": r["check"].bw} for r in self.results]}

    def lines(self) -> list[str]:
        out = []
        for doc in self.document()["patterns"]:
            out.append(f"integrity {doc['pattern']}: {doc['blocks']} blocks, "
                       f"{doc['bad_blocks']} bad [{doc['backend']}, O_DIRECT], write "
                       f"{units.format_quantity(doc['write_bw_bytes'], dimension='bandwidth')}, "
                       f"check {units.format_quantity(doc['read_bw_bytes'], dimension='bandwidth')}")
            out += [f"  {bad}" for bad in doc["bad"]]
            if doc["bad_blocks"] > len(doc["bad"]):
                out.append(f"  ... {doc['bad_blocks'] - len(doc['bad'])} more bad blocks")
        return out

    def exit_status(self) -> int:
        return Exit.FAIL if any(r["check"].bad_blocks for r in self.results) else Exit.PASS


def run(target: Target, table: dict, *, seed: int | None = None, progress=None,
        faults=()) -> IntegrityOutcome:
    """Every pattern of the table, one after the other."""
    results = []
    for i, pattern in enumerate(table["patterns"]):
        share = 1 / len(table["patterns"])

        def say(message, done=None, i=i):
            if progress:
                progress(message, None if done is None else (i + done) * share)
        results.append(run_pattern(target, table, pattern, seed=seed, faults=faults,
                                   progress=say))
    return IntegrityOutcome(results, target)


def _plan(table: dict, test: str, pattern, rates: Rates) -> list[Work]:
    """A pattern's test writes the region `generations` times and reads it once."""
    if not declares(TESTS, test) or pattern not in table["patterns"]:
        return []
    size = table["size"]
    written = table["generations"] * size
    return [Work(f"integrity {pattern}", written / rates.write_bw + size / rates.read_bw,
                 bytes_written=written, bytes_read=size, space=size,
                 what=f"the integrity region ({NAME}.size)")]


TESTS = (SuiteTest("blocks_read_back_as_written", "data integrity", "Every block of the "
                   "region holds its own offset, this run's seed and the last sequence "
                   "written, and its bytes pass their CRC32C.",
                   each=lambda table: list(table["patterns"]),
                   run=lambda target, table, pattern, *, seed, progress: IntegrityOutcome(
                       [run_pattern(target, table, pattern, progress=progress)], target)),)


FAMILY = Family(name=NAME, description="data integrity: verification blocks written, "
                "overwritten and checked", fields=FIELDS, metrics=METRICS, check=_check,
                cells=_cells, run=run, plan=_plan, tests=TESTS,
                fit=lambda table, room, need: {"size": room // table["block_size"] *
                                                       table["block_size"]})
