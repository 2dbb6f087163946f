"""Does the results store answer at a lab's scale? A store of `--runs` runs (default 10,000) of
`--measurements` final figures each (default 200), on SQLite (a file in /dev/shm) and on a
PostgreSQL server of the machine's own (started here as the tests start theirs, its data in
/dev/shm): the time `qual accept` takes to judge one model's firmware over its drives (each
drive's latest run), and the time a baseline query takes ('model=X firmware=F': every run of
it, records whole), each the median of `--rounds` rounds, in the process (no interpreter
start-up). The runs are stored with Store.put, one transaction a run, as rigs store them.

    python benchmarks/bench_store.py [--runs 10000] [--measurements 200] [--rounds 7]

Shape of the store: 50 models x 10 firmwares x 20 drives, one run per drive and firmware
(10,000 runs); a query touches one model and firmware (20 runs, 20 drives)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pgserver import PostgresServer  # noqa: E402 (the tests' own server)

from qual import accept as acceptance  # noqa: E402
from qual.measurement import measure, with_repetitions  # noqa: E402
from qual.record import RunRecord, TestResult  # noqa: E402
from qual.store import Store, parse_selector  # noqa: E402
from qual.thresholds import load_profile  # noqa: E402
from qual.workloads import registry  # noqa: E402
from qual.workloads.bandwidth import METRICS  # noqa: E402

MODELS, FIRMWARES, DRIVES = 50, 10, 20
PATTERNS = ("seq_read_bw", "seq_write_bw", "rand_read_bw", "rand_write_bw")
SIZES = [1 << s for s in range(12, 25)]  # 4K .. 16M
DEPTHS = [1, 2, 4, 8, 16, 32, 64, 128]


def figures(n: int, level: float) -> list[dict]:
    """n bandwidth figures (every pattern x block size x depth, as many as asked), each the
    median of three repetitions; the ci profile judges seq_read_bw[bs=1M,qd=16]."""
    out = [(p, bs, qd) for bs in SIZES for qd in DEPTHS for p in PATTERNS]
    first = ("seq_read_bw", 1 << 20, 16)
    out.remove(first)
    out.insert(0, first)
    return [with_repetitions(measure("bandwidth", METRICS[p], {"bs": bs, "qd": qd}, level,
                                     context={"backend": "io_uring"}),
                             [level * 0.99, level, level * 1.01]).as_dict()
            for p, bs, qd in out[:n]]


def record(model: int, firmware: int, drive: int, n: int, day: int) -> dict:
    level = 5e9 * (0.6 if drive == 7 else 1.0) * (1 + 0.001 * (drive % 5))
    ms = figures(n, level)
    verdict = {"id": ms[0]["id"], "metric": ms[0]["metric"], "value": ms[0]["value"],
               "passed": True, "inconclusive": False}
    test = TestResult("test_bandwidth.py::test_cell", "d", measurements=ms, verdicts=[verdict])
    return RunRecord(
        target={"spec": "/dev/x", "kind": "block", "identity": {
            "model": f"MODEL-{model:03d}", "serial": f"S{model:03d}-{drive:02d}",
            "firmware": f"{firmware}.0", "capacity": 1 << 42}},
        profile={"name": "ci", "digest": "bench"}, engine={}, tests=[test],
        summary={"verdict": "PASS"}, started=f"2026-{1 + day // 28:02d}-{1 + day % 28:02d}"
                                              f"T{drive % 24:02d}:00:00+0000",
        run_id=uuid.uuid4().hex, rig=f"rig-{drive % 8}").as_dict()


def build(db: Store, runs: int, n: int) -> float:
    t0 = time.monotonic()
    done = 0
    for firmware in range(FIRMWARES):
        for model in range(MODELS):
            for drive in range(DRIVES):
                if done == runs:
                    return time.monotonic() - t0
                db.put(record(model, firmware, drive, n, day=firmware * 30))
                done += 1
        print(f"  {done} runs stored ({done / (time.monotonic() - t0):.0f} runs/s)",
              file=sys.stderr)
    return time.monotonic() - t0


def timed(fn, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.monotonic()
        fn()
        out.append(time.monotonic() - t0)
    return out


def measure_store(url: str, args) -> dict:
    profile = load_profile("ci", registry())
    with Store.open(url) as db:
        built = build(db, args.runs, args.measurements)
        counts = db.counts()
        # the newest firmware stored in full (the store fills firmware by firmware)
        model, firmware = "MODEL-025", f"{max(args.runs // (MODELS * DRIVES) - 1, 0)}.0"

        def accept():
            a = acceptance.accept(db, model, firmware, profile)
            assert len(a.drives) == DRIVES and a.answer == "REJECT", a.reasons  # drive 7: 60 %

        def baseline():
            records = db.select(parse_selector(f"model={model} firmware={firmware}"),
                                profile="ci")
            assert len(records) == DRIVES
            assert len(records[0]["tests"][0]["measurements"]) == args.measurements

        accept_s = timed(accept, args.rounds)
        baseline_s = timed(baseline, args.rounds)
    return {"url": url.split("@")[-1], "counts": counts, "build_s": built,
            "accept_s": accept_s, "accept_median_s": statistics.median(accept_s),
            "baseline_s": baseline_s, "baseline_median_s": statistics.median(baseline_s)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=MODELS * FIRMWARES * DRIVES)
    p.add_argument("--measurements", type=int, default=200)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    out = {}
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="qual-bench-store-") as scratch:
        print("SQLite:", file=sys.stderr)
        out["sqlite"] = measure_store(f"sqlite:///{scratch}/store.sqlite", args)
        server = PostgresServer(root="/dev/shm").start()
        try:
            print("PostgreSQL:", file=sys.stderr)
            out["postgresql"] = measure_store(server.new_database(), args)
        finally:
            server.stop()
    print(json.dumps(out, indent=2))
    for name, r in out.items():
        print(f"{name}: {r['counts']['runs']} runs, {r['counts']['measurements']} figures, "
              f"built in {r['build_s']:.0f} s; accept {r['accept_median_s'] * 1000:.0f} ms, "
              f"baseline query {r['baseline_median_s'] * 1000:.0f} ms (medians of "
              f"{len(r['accept_s'])})", file=sys.stderr)


if __name__ == "__main__":
    main()
