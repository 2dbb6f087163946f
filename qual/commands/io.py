"""`qual io`: one fio-like I/O job on a target, and what it measured."""

from __future__ import annotations

import errno
import json

from qual import command, engine, units, watchdog
from qual.exits import Exit, ExitHelp, help_text
from qual.errors import InvalidJob
from qual.settings import duration, positive, size


RW = {"read": ("read", "sequential"), "randread": ("read", "random"),
      "write": ("write", "sequential"), "randwrite": ("write", "random"),
      "rw": ("mixed", "sequential"), "randrw": ("mixed", "random")}


DEFAULT_COMMAND_TIMEOUT_S = watchdog.DEFAULT_COMMAND_TIMEOUT_S


def add(sub, families: dict) -> None:
    """The command's parser."""
    io = sub.add_parser("io", help="run one I/O job (fio-like flags)",
                        description="Run one I/O job on a target and print what it measured, "
                                    "as fio does.",
                        epilog=help_text((Exit.PASS, "done"), (Exit.FAIL, "the target or the "
                                         "drive failed (an I/O error, a stall)"),
                                         (Exit.USAGE, "a bad flag or job, before any I/O"),
                                         Exit.INTERRUPTED),
                        formatter_class=ExitHelp)
    io.add_argument("--target", default=None,
                    help="file, directory or block device (default: .qual/target.dat)")
    io.add_argument("--rw", choices=list(RW), default="randread",
                    help="the pattern, as fio's rw (default randread)")
    io.add_argument("--rwmixread", type=int, default=None, metavar="PERCENT",
                    help="rw/randrw: per cent of I/Os that read (default 50, as in fio)")
    io.add_argument("--bs", type=size, default=4096,
                    help="block size: 4k, 128K, 1M (default 4k)")
    io.add_argument("--iodepth", type=positive, default=1,
                    help="I/Os in flight per job (default 1)")
    io.add_argument("--numjobs", type=positive, default=1,
                    help="workers, each a thread with its own ring (default 1)")
    io.add_argument("--iodepth_batch_submit", "--iodepth_batch", dest="submit_batch", type=int,
                    default=1, help="I/Os per submission syscall, 0 for all ready (fio's "
                                    "default 1: each I/O at once)")
    io.add_argument("--size", type=size, default=1 << 30,
                    help="region size; without --runtime also the bytes to move (default 1G)")
    io.add_argument("--offset", type=size, default=None, help="region start (default 0)")
    io.add_argument("--runtime", type=duration, default=None, help="time bound (10s, 500ms)")
    io.add_argument("--direct", type=int, choices=(0, 1), default=1,
                    help="1: O_DIRECT (default); 0: through the page cache")
    io.add_argument("--ioengine", "--engine", dest="engine", choices=engine.BACKENDS,
                    default="auto", help="I/O backend (fio's ioengine): io_uring, psync, or "
                                         "auto (io_uring where available)")
    io.add_argument("--seed", type=int, default=1,
                    help="seed of random offsets and write data (default 1)")
    io.add_argument("--keep", action="store_true",
                    help="keep the scratch file qual made for the job (a later job reuses it "
                         "instead of filling it again)")
    io.add_argument("--command-timeout", type=duration, default=DEFAULT_COMMAND_TIMEOUT_S,
                    help="an I/O outstanding this long is a stall, and the command ends with "
                         "it (default 30s, NVMe's)")
    io.add_argument("--json", action="store_true", help="print a JSON document")
    io.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    io.add_argument("--allow-destructive", action="store_true",
                    help="allow writes to a block device (the safety guard still applies)")
    io.add_argument("--confirm-serial", default=None, help="serial of the device to overwrite")
    io.set_defaults(handler=handle)


def handle(args, extra: list[str], families: dict) -> int:
    with command.watched("io", args.target, args.command_timeout):
        return cmd_io(args)


def cmd_io(args) -> int:
    op, pattern = RW[args.rw]
    if args.rwmixread is not None and op != "mixed":
        raise InvalidJob(errno.EINVAL, f"--rwmixread applies to rw and randrw, not {args.rw}")
    target = command.open_target(args.target, args)
    # as in fio, a job without a runtime moves --size, rounded down to whole blocks
    whole = args.size - args.size % args.bs if args.bs > 0 else args.size
    job = target.job(op=op, pattern=pattern, block_size=args.bs, queue_depth=args.iodepth,
                     workers=args.numjobs, submit_batch=args.submit_batch,
                     offset=args.offset or 0, size=args.size,
                     bytes=whole if args.runtime is None else None, runtime=args.runtime,
                     seed=args.seed, backend=args.engine, direct=bool(args.direct),
                     rwmixread=50 if args.rwmixread is None else args.rwmixread,
                     command_timeout=args.command_timeout)
    say = command.Reporter("io", args.quiet)
    result = command.on_target(target, lambda t: _run_io(t.prepare(job), args, say),
                               say=say.say, keep=args.keep)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(human_line(result))
    return Exit.PASS


def _run_io(job: engine.IoJob, args, say: command.Reporter) -> engine.IoResult:
    """The job, with progress on stderr (at most a line every 10 s; not with -q) and an ETA
    from its time bound or its byte bound."""
    def progress(done: int, ops: int, seconds: float) -> None:
        rate = units.format_quantity(done / seconds, dimension="bandwidth") if seconds else "-"
        share = seconds / job.runtime if job.runtime else done / job.bytes if job.bytes else None
        say(f"{args.rw}: {units.format_size(done)} moved ({rate})",
            None if share is None else min(share, 0.99))

    try:
        return engine.run_job(job, progress=None if args.quiet else progress)
    finally:
        say.done()


def human_line(result: engine.IoResult) -> str:
    job, lat = result.job, result.latency.summary()
    us = {k: units.format_quantity(v / 1e9, "us") for k, v in lat.items()}
    split = "".join(
        f"{name} {units.format_quantity(d.ops / result.elapsed, dimension='rate')} "
        f"(p99.99 {units.format_quantity(d.latency.summary()['p99.99'] / 1e9, 'us')}), "
        for name, d in (("read", result.read), ("write", result.write))
        if job.op == "mixed" and result.elapsed > 0)
    return (f"{job.rw} bs={units.format_size(job.block_size)} iodepth={job.queue_depth} "
            f"numjobs={job.workers} [{result.backend}{'' if job.direct else ', page cache'}]: "
            f"{units.format_quantity(result.bandwidth, dimension='bandwidth')}, "
            f"{units.format_quantity(result.iops, dimension='rate')}, {split}"
            f"lat p50 {us['p50']} p99 {us['p99']} p99.99 {us['p99.99']} max {us['max']}, "
            f"cpu {result.cpu:.2f} s ({units.format_quantity(result.cpu_per_io, 'us')}/IO), "
            f"{units.format_size(result.bytes)} in {result.elapsed:.2f} s")
