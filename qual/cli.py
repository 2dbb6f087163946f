"""The `qual` command: one subcommand per workload (`io`, `checkpoint`, `gnn`, `train`), `run`
(the suites, a thin wrapper over pytest), `report` (Allure HTML), `compare` (firmware gating),
`profiles` (the shipped profiles) and `clean` (removes what qual made on a target)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from qual import engine, record, report, shipped, units
from qual.engine import QualError
from qual.record import RECORD_NAME
from qual.target import Target
from qual.thresholds import DEFAULT_GATE, SEVERITIES, ProfileError, family_table
from qual.workloads import checkpoint, gnn, training
from qual.workloads.checkpoint.plan import MODELS, RECIPES, describe
from qual.workloads.gnn.igbh import SIZES
from qual.workloads.training.configs import WORKLOADS

RW = {"read": ("read", "sequential"), "randread": ("read", "random"),
      "write": ("write", "sequential"), "randwrite": ("write", "random")}


def _size(text: str) -> int:
    try:
        return units.parse_size(text)
    except units.UnitError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _duration(text: str) -> float:
    try:
        return units.parse_duration(text)
    except units.UnitError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> int:
    try:
        return units.parse_count(text, name="value")
    except units.UnitError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qual", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    io = sub.add_parser("io", help="run one I/O job (fio-like flags)",
                        description="Run one I/O job on a target and print what it measured.")
    io.add_argument("--target", default=None,
                    help="file, directory or block device (default: .qual/target.dat)")
    io.add_argument("--rw", choices=list(RW), default="randread")
    io.add_argument("--bs", type=_size, default=4096, help="block size (4k, 128K, 1M)")
    io.add_argument("--iodepth", type=_positive, default=1, help="I/Os in flight per job")
    io.add_argument("--numjobs", type=_positive, default=1, help="workers (threads)")
    io.add_argument("--iodepth_batch_submit", "--iodepth_batch", dest="submit_batch", type=int,
                    default=1, help="I/Os per submission syscall, 0 for all ready (fio's "
                                    "default 1: each I/O at once)")
    io.add_argument("--size", type=_size, default=1 << 30,
                    help="region size; without --runtime also the bytes to move (default 1G)")
    io.add_argument("--offset", type=_size, default=None, help="region start (default 0)")
    io.add_argument("--runtime", type=_duration, default=None, help="time bound (10s, 500ms)")
    io.add_argument("--direct", type=int, choices=(0, 1), default=1,
                    help="1: O_DIRECT (default); 0: through the page cache")
    io.add_argument("--engine", choices=engine.BACKENDS, default="auto",
                    help="I/O backend: io_uring, psync, or auto (io_uring where available)")
    io.add_argument("--seed", type=int, default=1)
    io.add_argument("--json", action="store_true", help="print a JSON document")
    io.add_argument("--allow-destructive", action="store_true",
                    help="allow writes to a block device (the safety guard still applies)")
    io.add_argument("--confirm-serial", default=None, help="serial of the device to overwrite")

    run = sub.add_parser("run", help="run the qualification suites (a wrapper over pytest)",
                         description="Run the suites; unknown arguments go to pytest.")
    run.add_argument("--target", action="append", default=None,
                     help="file, directory or block device; several for a rig's drives")
    run.add_argument("--profile", default="ci", help="profile name or .toml path (default ci)")
    run.add_argument("--results", default="qual-results",
                     help="folder for qual-run.json and allure-results/ (default qual-results)")

    ck = sub.add_parser("checkpoint", help="write (and restore) LLM checkpoints",
                        description="Write LLM checkpoints DLIO-style with the native engine, "
                                    "one process per rank; restore and verify the last one.")
    ck.add_argument("--target", default=None, help="a directory on the drive (default: .qual/)")
    ck.add_argument("--model", default="llama3.1-8b", choices=sorted(MODELS))
    ck.add_argument("--recipe", default="mixed-adam", choices=sorted(RECIPES))
    ck.add_argument("--tp", type=_positive, default=1, help="tensor-parallel ranks")
    ck.add_argument("--pp", type=_positive, default=1, help="pipeline-parallel ranks")
    ck.add_argument("--dp", type=_positive, default=1, help="data-parallel ranks")
    ck.add_argument("--zero", type=int, choices=(0, 1, 3), default=0, help="ZeRO stage")
    ck.add_argument("--scale", type=float, default=1.0, help="shrink every tensor (0 < s <= 1)")
    ck.add_argument("--ranks", type=int, default=0,
                    help="processes on this host (default: every rank of the layout)")
    ck.add_argument("--count", type=_positive, default=1, help="checkpoints to write")
    ck.add_argument("--restore", action="store_true", help="restore and verify the last one")
    ck.add_argument("--baseline", action="store_true",
                    help="also time torch.save and torch.load of the same tensors")
    ck.add_argument("--keep", type=_positive, default=2, help="checkpoints kept (default 2)")
    ck.add_argument("--plan", action="store_true",
                    help="print every rank's size and the arithmetic, and stop")
    ck.add_argument("--json", action="store_true", help="print a JSON document")
    ck.add_argument("--seed", type=int, default=1)

    gn = sub.add_parser("gnn", help="train RGAT on IGBH through the GIDS-style and mmap loaders",
                        description="Train RGAT on an IGBH graph (synthetic, or a downloaded "
                                    "one) through the GIDS-style loader and the mmap baseline.")
    gn.add_argument("--target", default=None, help="a directory on the drive (default: .qual/)")
    gn.add_argument("--dataset", default="synthetic",
                    help="'synthetic' (generated on the target) or the root of a downloaded IGBH")
    gn.add_argument("--size", default="tiny", choices=list(SIZES))
    gn.add_argument("--scale", type=float, default=1.0, help="synthetic: share of the nodes")
    gn.add_argument("--loader", default="both", choices=("gids", "mmap", "both"))
    gn.add_argument("--steps", type=_positive, default=100, help="measured steps (seed: 100)")
    gn.add_argument("--warmup", type=int, default=10)
    gn.add_argument("--epochs", type=_positive, default=1)
    gn.add_argument("--batch-size", type=_positive, default=512)
    gn.add_argument("--fanouts", default="10,5", help="neighbours per hop, e.g. 10,5")
    gn.add_argument("--keep", action="store_true",
                    help="keep the generated dataset and feature store for the next run")
    gn.add_argument("--json", action="store_true", help="print a JSON document")
    gn.add_argument("--seed", type=int, default=1)

    tr = sub.add_parser("train", help="simulated accelerators reading training data (DLIO)",
                        description="Simulated accelerators read a DLIO-style dataset from the "
                                    "target and compute for a fixed time per step; reports AU, "
                                    "samples/s and bandwidth.")
    tr.add_argument("--target", default=None, help="a directory on the drive (default: .qual/)")
    tr.add_argument("--workload", default="unet3d-h100", choices=list(WORKLOADS))
    tr.add_argument("--accelerators", type=_positive, default=1)
    tr.add_argument("--epochs", type=_positive, default=1)
    tr.add_argument("--files", type=_positive, default=None, help="default: the workload's")
    tr.add_argument("--record-scale", type=float, default=1.0,
                    help="scales every sample's size, for small targets")
    tr.add_argument("--batch-size", type=_positive, default=None)
    tr.add_argument("--computation-time", default=None, help="per step, e.g. 0.323s or 50ms")
    tr.add_argument("--read-threads", type=_positive, default=None)
    tr.add_argument("--bs", default="1M", help="bytes per read (default 1M)")
    tr.add_argument("--iodepth", type=_positive, default=8, help="reads in flight per thread")
    tr.add_argument("--page-cache", action="store_true", help="read without O_DIRECT")
    tr.add_argument("--no-calibrate", action="store_true",
                    help="skip the no-storage run that measures the AU ceiling")
    tr.add_argument("--seed", type=int, default=None,
                    help="file order seed (default: a new one every run)")
    tr.add_argument("--keep", action="store_true", help="keep the dataset for the next run")
    tr.add_argument("--json", action="store_true", help="print a JSON document")

    rp = sub.add_parser("report", help="the HTML qualification report (Allure 3)",
                        description="Build the Allure HTML report of one or more runs with the "
                                    "Allure 3 CLI and qual's allurerc.mjs, then apply its "
                                    "quality gate. Exit 0: built and the gate holds; 1: the "
                                    "gate failed; 2: nothing to report or no Allure 3 CLI.")
    rp.add_argument("results", nargs="+", help="qual results folders (qual-results/) or "
                                               "allure-results folders")
    rp.add_argument("--out", required=True, help="the report folder (made by qual)")
    rp.add_argument("--single-file", action="store_true",
                    help="one self-contained index.html, to attach to an acceptance email")
    rp.add_argument("--history", default=None, metavar="JSONL",
                    help="trend history across runs (default: qual-history.jsonl beside --out)")
    rp.add_argument("--gate", choices=SEVERITIES, default=None,
                    help="least severity whose failed test fails the gate (default: the "
                         "profile's `gate`)")

    cmp = sub.add_parser("compare", help="gate a run record against a baseline (firmware CI)",
                         description="Compare every comparable measurement of NEW with the same "
                                     "measurement of BASELINE, against the profile's tolerance. "
                                     "Exit 0: all within tolerance; 1: a regression; 2: refused "
                                     "or unreadable; 3: no regression, but a metric improved "
                                     "beyond its tolerance (refresh the baseline).")
    cmp.add_argument("baseline", help="the previous run record (qual-run.json)")
    cmp.add_argument("new", help="the run record to judge")
    cmp.add_argument("--tolerance", default=None,
                     help="for criteria with no tolerance of their own (default: the profile's)")
    cmp.add_argument("--allow-other-drive", action="store_true",
                     help="compare records of different drive models")
    cmp.add_argument("--allow-other-profile", action="store_true",
                     help="compare records of different profiles")
    cmp.add_argument("--accept-improvements", action="store_true",
                     help="exit 0, not 3, when metrics only improved")
    cmp.add_argument("--chart", default=None, metavar="PNG", help="write a before/after chart")
    cmp.add_argument("--json", action="store_true", help="print a JSON document")

    sub.add_parser("profiles", help="list the shipped profiles")

    clean = sub.add_parser("clean", help="remove the scratch file qual created on a target")
    clean.add_argument("target", nargs="?", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "io":
            return cmd_io(args)
        if args.command == "checkpoint":
            return cmd_checkpoint(args)
        if args.command == "gnn":
            return cmd_gnn(args)
        if args.command == "train":
            return cmd_train(args)
        if args.command == "run":
            return cmd_run(args, extra)
        if args.command == "profiles":
            return cmd_profiles()
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "clean":
            target = Target(args.target)
            target.cleanup()
            checkpoint.remove(target)
            gnn.remove(target)
            training.remove(target)
            return 0
    except QualError as e:
        print(f"qual {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"qual {args.command}: interrupted", file=sys.stderr)
        return 130
    return 2


def cmd_io(args) -> int:
    op, pattern = RW[args.rw]
    target = Target(args.target, allow_destructive=args.allow_destructive,
                    confirm_serial=args.confirm_serial)
    # as in fio, a job without a runtime moves --size, rounded down to whole blocks
    whole = args.size - args.size % args.bs if args.bs > 0 else args.size
    job = target.job(op=op, pattern=pattern, block_size=args.bs, queue_depth=args.iodepth,
                     workers=args.numjobs, submit_batch=args.submit_batch,
                     offset=args.offset or 0, size=args.size,
                     bytes=whole if args.runtime is None else None, runtime=args.runtime,
                     seed=args.seed, backend=args.engine, direct=bool(args.direct))
    target.lock()
    try:
        result = _run_io(target.prepare(job), args)
    finally:
        target.unlock()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(human_line(result))
    return 0


def _run_io(job: engine.IoJob, args) -> engine.IoResult:
    show = sys.stderr.isatty() and not args.json

    def progress(done: int, ops: int, seconds: float) -> None:
        rate = units.format_quantity(done / seconds, dimension="bandwidth") if seconds else "-"
        print(f"\r{args.rw}: {units.format_size(done)} in {seconds:.0f} s ({rate})   ",
              end="", file=sys.stderr, flush=True)

    result = engine.run_job(job, progress=progress if show else None)
    if show:
        print(file=sys.stderr)
    return result


def human_line(result: engine.IoResult) -> str:
    job, lat = result.job, result.latency.summary()
    us = {k: units.format_quantity(v / 1e9, "us") for k, v in lat.items()}
    return (f"{job.rw} bs={units.format_size(job.block_size)} iodepth={job.queue_depth} "
            f"numjobs={job.workers} [{result.backend}{'' if job.direct else ', page cache'}]: "
            f"{units.format_quantity(result.bandwidth, dimension='bandwidth')}, "
            f"{units.format_quantity(result.iops, dimension='rate')}, "
            f"lat p50 {us['p50']} p99 {us['p99']} p99.99 {us['p99.99']} max {us['max']}, "
            f"cpu {result.cpu:.2f} s ({units.format_quantity(result.cpu_per_io, 'us')}/IO), "
            f"{units.format_size(result.bytes)} in {result.elapsed:.2f} s")


def _flags_table(command: str, family: str, given: dict) -> dict | None:
    """The family's table from command-line flags, or None after saying what is wrong with
    them (nothing has been read or written yet)."""
    try:
        return family_table(family, {k: v for k, v in given.items() if v is not None})
    except ProfileError as e:
        for _, key, problem in e.problems:
            flag = key.split(".")[-1].replace("_", "-")
            print(f"qual {command}: error: --{flag}: {problem}", file=sys.stderr)
        return None


def _family_command(command: str, family, given: dict, args, document, show, **kw) -> int:
    """A workload subcommand: check the flags (nothing touched yet), run the family on
    --target, and print its document as JSON (--json) or as lines for a person."""
    table = _flags_table(command, family.NAME, given)
    if table is None:
        return 2
    doc = document(_run_family(family, table, args, **kw))
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        show(doc)
    return 0


def _run_family(family, table: dict, args, **kw) -> dict:
    """Run a workload family's module on --target, holding the target, with progress on a
    terminal, and remove what it made unless --keep."""
    target = Target(args.target)
    target.lock()
    quiet = args.json or not sys.stderr.isatty()
    try:
        return family.run(target, table, **kw,
                          progress=None if quiet else lambda m: print(m, file=sys.stderr))
    finally:
        if not args.keep:
            family.remove(target)
        target.unlock()


def cmd_checkpoint(args) -> int:
    given = {"model": args.model, "recipe": args.recipe, "tp": args.tp, "pp": args.pp,
             "dp": args.dp, "zero": args.zero, "scale": args.scale, "ranks": args.ranks,
             "passes": 1, "per_pass": args.count, "retention": args.keep,
             "restore": args.restore, "baseline": args.baseline}
    table = _flags_table("checkpoint", checkpoint.NAME, given)
    if table is None:
        return 2
    if args.plan:
        plan = checkpoint.plan_of(table)
        print(json.dumps({**plan.summary(), "derivation": describe(plan)}, indent=2)
              if args.json else describe(plan))
        return 0
    target = Target(args.target)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if not torchrun:  # under torchrun every rank opens the target: rank 0 speaks for them
        target.lock()
    try:
        result = checkpoint.run(target, table, seed=args.seed)
    finally:
        target.unlock()
    if result is None:
        return 0  # a rank other than 0 under torchrun
    doc = checkpoint_document(result)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        gb = doc["bytes"] / 1e9
        for i, s in enumerate(doc["write_s"], 1):
            print(f"checkpoint {i}: {gb:.3f} GB in {s:.2f} s ({gb / s:.2f} GB/s) [{doc['backend']}]")
        if args.restore:
            print(f"restore: {doc['restore_s']:.2f} s ({doc['restore_bw_bytes'] / 1e9:.2f} GB/s), "
                  f"verified: {doc['verified']}" + "".join(f"\n  {e}" for e in doc["restore_errors"]))
        if args.baseline:
            print(f"torch.save + fsync: {doc['torch_save_bw_bytes'] / 1e9:.2f} GB/s, "
                  f"torch.load: {doc['torch_load_bw_bytes'] / 1e9:.2f} GB/s")
        print(f"kept in {doc['store']}: {', '.join(doc['kept'])}")
    return 0 if not args.restore or doc["verified"] else 1


def checkpoint_document(result: dict) -> dict:
    """The `qual checkpoint --json` document."""
    cps = result["checkpoints"]
    size = cps[0]["bytes"] if cps else 0
    seconds = [c["seconds"] for c in cps]
    doc = {"bytes": size, "ranks": result["world"], "plan": result["plan"],
           "backend": cps[0]["backend"] if cps else None, "write_s": seconds,
           "write_bw_bytes": size * len(seconds) / sum(seconds) if seconds else 0.0,
           "store": result["store"], "kept": result["kept"]}
    r = result["restore"]
    if r:
        doc.update(restore_s=r["seconds"], restore_bw_bytes=r["bytes"] / r["seconds"]
                   if r["bytes"] else 0.0, verified=r["intact"], restore_errors=r["errors"])
    t = result["torch"]
    if t:
        doc.update(torch_save_bw_bytes=t["bytes"] / t["save_s"],
                   torch_load_bw_bytes=t["bytes"] / t["load_s"])
    return doc


def cmd_gnn(args) -> int:
    given = {"dataset": args.dataset, "size": args.size, "scale": args.scale,
             "loaders": list(gnn.LOADERS) if args.loader == "both" else [args.loader],
             "steps": args.steps, "warmup": args.warmup, "epochs": args.epochs,
             "batch_size": args.batch_size}
    try:
        given["fanouts"] = [int(f) for f in args.fanouts.split(",")]
    except ValueError as e:
        print(f"qual gnn: error: --fanouts: {e}", file=sys.stderr)
        return 2
    return _family_command("gnn", gnn, given, args, gnn_document, print_gnn, seed=args.seed)


def print_gnn(doc: dict) -> None:
    for name in doc["accuracy"]:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in doc["stages"][name].items())
        print(f"{name}: {doc['e2e_s'][name]:.2f} s for {doc['steps']} steps ({stages}), "
              f"validation accuracy {doc['accuracy'][name] * 100:.1f} %")
    if "speedup" in doc:
        print(f"GIDS speedup over mmap: {doc['speedup']:.2f}x")
    if "cache" in doc:
        c = doc["cache"]
        print(f"GIDS cache: hit rate {c['hit_rate'] * 100:.1f} % ({c['hits']} hits, "
              f"{c['cpu_buffer_hits']} CPU-buffer hits, {c['misses']} misses, "
              f"{c['ssd_reads']} SSD reads)")


def gnn_document(result: dict) -> dict:
    """The `qual gnn --json` document."""
    loaders = result["loaders"]
    row = result["store"]["row_bytes"]
    doc = {"dataset": result["dataset"], "steps": next(iter(loaders.values()))["measured"],
           "e2e_s": {k: v["e2e_s"] for k, v in loaders.items()},
           "accuracy": {k: v["accuracy"] for k, v in loaders.items()},
           "stages": {k: v["stages"] for k, v in loaders.items()},
           "effective_bw_bytes": {k: v["rows"] * row / v["stages"]["gather"]
                                  for k, v in loaders.items() if v["stages"]["gather"]},
           "setup": {k: v["setup"] for k, v in loaders.items()}}
    if "gids" in loaders and "mmap" in loaders:
        doc["speedup"] = loaders["mmap"]["e2e_s"] / loaders["gids"]["e2e_s"]
    c = loaders.get("gids", {}).get("cache")
    if c:
        doc["cache"] = {"hits": c["hits"], "misses": c["misses"], "cpu_buffer_hits": c["cpu_hits"],
                        "ssd_reads": c["reads"], "ssd_read_bytes": c["read_bytes"],
                        "hit_rate": c["hit_rate"], "writes": c["writes"]}
    return doc


def cmd_train(args) -> int:
    given = {"workload": args.workload, "accelerators": [args.accelerators],
             "epochs": [args.epochs], "files": args.files, "record_scale": args.record_scale,
             "batch_size": args.batch_size, "computation_time": args.computation_time,
             "read_threads": args.read_threads, "block_size": args.bs,
             "queue_depth": args.iodepth, "direct": not args.page_cache,
             "calibrate": not args.no_calibrate, "shuffle_seed": args.seed}
    return _family_command("train", training, given, args, training_document, print_training,
                           seed=args.seed)


def print_training(doc: dict) -> None:
    for e in doc["per_epoch"]:
        print(f"epoch {e['epoch']}: AU {e['au_mean'] * 100:.1f} %, {e['samples_per_s']:.1f} "
              f"samples/s, {e['bw_bytes'] / 2**20:.0f} MiB/s, device read "
              + (units.format_size(e["device"]["read_bytes"]) if e["device"] else "unknown"))
    ceiling = f", ceiling without storage {doc['au_ceiling'] * 100:.1f} %" \
        if doc["au_ceiling"] is not None else ""
    print(f"{doc['workload']}, {doc['accelerators']} accelerator(s) [{doc['backend']}, "
          f"{doc['path']}]: AU mean {doc['au_mean'] * 100:.1f} %, lowest epoch "
          f"{doc['au_min_epoch'] * 100:.1f} %{ceiling}; {doc['samples_per_s']:.1f} samples/s, "
          f"{doc['bw_bytes'] / 2**20:.0f} MiB/s")
    for caveat in doc["caveats"]:
        print(f"CAVEAT: {caveat}")


def training_document(result: dict) -> dict:
    """The `qual train --json` document (one accelerator count, one epochs value)."""
    r = result["runs"][0]
    n = r["accelerators"]
    calib = result["calibration"].get(n)
    return {"workload": result["workload"]["name"], "accelerators": n, "epochs": r["epochs"],
            "backend": r["backend"], "path": r["path"], "au_mean": r["au_mean"],
            "au_min_epoch": r["au_min_epoch"], "samples_per_s": r["samples_per_s"],
            "bw_bytes": r["bw_bytes"], "bytes": r["bytes"],
            "device_read_bytes": r["device_read_bytes"],
            "au_ceiling": calib["au_mean"] if calib else None,
            "steps_per_epoch": r["steps_per_epoch"], "shuffle_seed": result["shuffle_seed"],
            "dataset": result["dataset"], "dataset_rule": result["rule"][n],
            "caveats": training.caveats(result, n), "per_epoch": r["per_epoch"]}


REPORT_MARK = ".qual-report"  # in a report folder qual made: the only kind it overwrites


def cmd_report(args) -> int:
    import subprocess

    def fail(message: str) -> int:
        print(f"qual report: error: {message}", file=sys.stderr)
        return 2

    allure_dirs, records = [], []
    for folder in map(Path, args.results):
        if not folder.is_dir():
            return fail(f"{folder} is not a folder")
        dirs, recs = report.find_results(folder)
        if not dirs:
            return fail(f"{folder} holds no Allure results (qual run writes them to "
                        "qual-results/allure-results)")
        allure_dirs += dirs
        records += recs
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not (out / REPORT_MARK).exists():
        return fail(f"{out} is not empty and qual did not make it: give a new folder")
    cli = report.allure_command()
    if cli is None:
        return fail(report.ALLURE_MISSING)
    gate = args.gate or next((r["profile"].get("gate") for r in records
                              if r["profile"].get("gate")), DEFAULT_GATE)
    history = Path(args.history) if args.history else out.resolve().parent / "qual-history.jsonl"
    env = {**os.environ, "QUAL_REPORT_NAME": report.report_name(records) if records else
           "qual qualification", "QUAL_OUTPUT": str(out.resolve()), "QUAL_HISTORY": str(history),
           "QUAL_SINGLE_FILE": "1" if args.single_file else "0",
           "QUAL_GATE_SEVERITIES": ",".join(SEVERITIES[:SEVERITIES.index(gate) + 1]),
           "NO_COLOR": "1", "FORCE_COLOR": "0"}
    config = shipped("allure") / "allurerc.mjs"
    dirs = [str(d.resolve()) for d in allure_dirs]
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_MARK).write_text("made by qual report\n")
    built = subprocess.run([*cli, "generate", "--config", str(config), "--output",
                            str(out.resolve()), *dirs], env=env, capture_output=True, text=True)
    # the Awesome plugin writes to --out itself or, in some layouts, to its own subfolder
    index = next((p for p in (out / "index.html", out / "awesome" / "index.html") if p.exists()),
                 None)
    if built.returncode != 0 or index is None:
        return fail(f"the Allure CLI could not build the report:\n{built.stdout}{built.stderr}")
    # the gate keeps state in its output folder, and counts nothing it has seen there before:
    # give it a fresh one of its own
    with tempfile.TemporaryDirectory(prefix="qual-gate-") as scratch:
        gated = subprocess.run([*cli, "quality-gate", "--config", str(config), *dirs],
                               env={**env, "QUAL_OUTPUT": scratch}, capture_output=True,
                               text=True)
    said = (gated.stdout + gated.stderr).strip()
    if gated.returncode != 0 and "quality gate" not in said.lower():  # it broke, not judged
        return fail(f"the report is at {index}, but the Allure CLI could not apply the "
                    f"quality gate:\n{said[-2000:]}\n{report.ALLURE_MISSING}")
    print(f"report: {index}" + (" (single file)" if args.single_file else ""))
    if not args.single_file:  # its pages load their data over HTTP, which file:// cannot serve
        print(f"open it with: {' '.join(cli)} open {index.parent}")
    print(f"history: {history}")
    print(f"quality gate (no failed test of severity {gate} or above): "
          + ("passed" if gated.returncode == 0 else "FAILED"))
    if gated.returncode != 0:
        print(said)
    return 0 if gated.returncode == 0 else 1


def cmd_compare(args) -> int:
    def fail(message: str) -> int:
        print(f"qual compare: error: {message}", file=sys.stderr)
        return 2

    try:
        old, new = record.read_record(args.baseline), record.read_record(args.new)
        tolerance = units.parse_quantity(args.tolerance, "ratio") if args.tolerance else None
    except (ValueError, units.UnitError) as e:
        return fail(str(e))
    refused = record.mismatches(old, model=record.drive_model(new),
                                profile=new.get("profile", {}).get("name"))
    refused = [r for r in refused if not (
        (r.startswith("drive model") and args.allow_other_drive) or
        (r.startswith("profile") and args.allow_other_profile))]
    if refused:
        return fail("; ".join(refused) + " (--allow-other-drive / --allow-other-profile to "
                    "compare them anyway)")
    rows, gone, added = record.compare_records(old, new, old_label=Path(args.baseline).name,
                                               default_tolerance=tolerance)
    if not rows:
        return fail(f"{args.new} and {args.baseline} share no comparable measurement")
    regressed = [r for r in rows if not r.passed]
    improved = [r for r in rows if r.improved]
    if args.chart:
        Path(args.chart).write_bytes(report.baseline_chart(rows, f"{args.baseline} -> {args.new}"))
    refresh = f"cp {args.new} {args.baseline}"
    if args.json:
        print(json.dumps({"baseline": args.baseline, "new": args.new,
                          "metrics": [r.as_dict() for r in rows], "regressed": len(regressed),
                          "improved": len(improved), "only_in_baseline": gone,
                          "only_in_new": added, "refresh_baseline": refresh}, indent=2))
    else:
        for label, path, doc in (("baseline", args.baseline, old), ("new", args.new, new)):
            print(f"{label:8}  {path}: {report.run_label(doc)}")
        for line in report.table_lines(report.comparison_rows(rows),
                                       header=report.COMPARISON_HEADER):
            print(line)
        print(f"{len(rows)} compared: {len(regressed)} regressed, {len(improved)} improved "
              f"beyond tolerance, {len(rows) - len(regressed) - len(improved)} within tolerance")
        for mid in gone:
            print(f"not measured in the new run: {mid}")
        for r in regressed:
            print(f"REGRESSED: {r.line()}")
        for r in improved:
            print(f"IMPROVED: {r.line()}")
        print(f"to make the new run the baseline: {refresh}")
    if regressed:
        return 1
    return 3 if improved and not args.accept_improvements else 0


def cmd_run(args, extra: list[str]) -> int:
    import pytest

    results = Path(args.results)
    alluredir = results / "allure-results"
    # Allure results accumulate across runs: start clean, here and not under xdist workers
    shutil.rmtree(alluredir, ignore_errors=True)
    (results / RECORD_NAME).unlink(missing_ok=True)
    for old in results.glob(f"*/{RECORD_NAME}"):  # a previous multi-drive run's records
        old.unlink()
    argv = [str(shipped("suites")), f"--qual-profile={args.profile}",
            f"--qual-results={results}", f"--alluredir={alluredir}", "-p", "no:cacheprovider", "-p", "no:benchmark"]
    argv += [f"--qual-target={t}" for t in args.target or ()]
    return int(pytest.main(argv + extra))


def cmd_profiles() -> int:
    from qual import thresholds

    rows = thresholds.list_profiles()
    width = max(len(name) for name, _, _ in rows)
    for name, description, _ in rows:
        print(f"{name:<{width}}  {description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
