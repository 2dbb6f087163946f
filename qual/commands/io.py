"""`qual io`: one fio-like I/O job on a target, and what it measured."""

from __future__ import annotations

import json

from qual import engine, units, watchdog
from qual.commands.target import (Reporter, add_target_flags, on_target, open_target,
                                  said_problems, watched)
from qual.exits import Exit, ExitHelp, help_text
from qual.family import Field
from qual.flags import add_field_flags, given
from qual.thresholds import ProfileError, field_table


RW = {"read": ("read", "sequential"), "randread": ("read", "random"),
      "write": ("write", "sequential"), "randwrite": ("write", "random"),
      "rw": ("mixed", "sequential"), "randrw": ("mixed", "random")}


# the job's settings, as fio spells them: the flags come from these fields, as a family's do
# (qual.flags), and are parsed by them (qual.settings)
FIELDS = (
    Field("rw", "choice", default="randread", choices=tuple(RW), help="the pattern, as fio's rw"),
    Field("rwmixread", "count", minimum=0, maximum=100,
          help="rw/randrw: per cent of I/Os that read (default 50, as in fio)"),
    Field("bs", "size", default="4k", help="block size"),
    Field("iodepth", "count", default=1, help="I/Os in flight per job"),
    Field("numjobs", "count", default=1, help="workers, each a thread with its own ring"),
    Field("submit_batch", "count", default=1, minimum=0, flag="--iodepth_batch_submit",
          aliases=("--iodepth_batch",), help="I/Os per submission syscall, 0 for all ready "
                                             "(fio's default 1: each I/O at once)"),
    Field("size", "size", default="1G", help="region size; without --runtime also the bytes "
                                             "to move"),
    Field("offset", "size", minimum=0, help="region start (default 0)"),
    Field("runtime", "duration", help="time bound (default none: --size is moved)"),
    Field("direct", "count", default=1, minimum=0, maximum=1,
          help="1: O_DIRECT; 0: through the page cache"),
    Field("engine", "choice", default="auto", choices=engine.BACKENDS, flag="--ioengine",
          aliases=("--engine",), help="I/O backend (fio's ioengine); auto: io_uring where "
                                      "available"),
    Field("seed", "count", default=1, minimum=0, help="seed of random offsets and write data"),
    Field("keep", "bool", default=False,
          help="keep the scratch file qual made for the job (a later job reuses it instead of "
               "filling it again)"),
    Field("command_timeout", "duration", default=f"{watchdog.DEFAULT_COMMAND_TIMEOUT_S:g}s",
          help="an I/O outstanding this long is a stall, and the command ends with it (NVMe's)"),
)


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
    add_target_flags(io, ".qual/target.dat")
    add_field_flags(io, FIELDS)
    io.set_defaults(handler=handle)


def handle(args, extra: list[str], families: dict) -> int:
    try:
        job = field_table(FIELDS, given(args, FIELDS), prefix="io", check=_check)
    except ProfileError as e:
        return said_problems("io", FIELDS, e.problems)
    with watched("io", args.target, job.command_timeout):
        return cmd_io(args, job)


def _check(job: dict) -> list[tuple[str, str]]:
    if "rwmixread" in job and RW[job["rw"]][0] != "mixed":
        return [("rwmixread", f"applies to rw and randrw, not {job['rw']}")]
    return []


def cmd_io(args, settings) -> int:
    op, pattern = RW[settings.rw]
    target = open_target(args.target, args)
    bs = settings.bs
    # as in fio, a job without a runtime moves --size, rounded down to whole blocks
    whole = settings.size - settings.size % bs
    runtime = settings.get("runtime")
    job = target.job(op=op, pattern=pattern, block_size=bs, queue_depth=settings.iodepth,
                     workers=settings.numjobs, submit_batch=settings.submit_batch,
                     offset=settings.get("offset", 0), size=settings.size,
                     bytes=whole if runtime is None else None, runtime=runtime,
                     seed=settings.seed, backend=settings.engine, direct=bool(settings.direct),
                     rwmixread=settings.get("rwmixread", 50),
                     command_timeout=settings.command_timeout)
    say = Reporter("io", args.quiet)
    result = on_target(target, lambda t: _run_io(t.prepare(job), settings.rw, args, say),
                               say=say.say, keep=settings.keep)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(human_line(result))
    return Exit.PASS


def _run_io(job: engine.IoJob, rw: str, args, say: Reporter) -> engine.IoResult:
    """The job, with progress on stderr (at most a line every 10 s; not with -q) and an ETA
    from its time bound or its byte bound."""
    def progress(done: int, ops: int, seconds: float) -> None:
        rate = units.format_quantity(done / seconds, dimension="bandwidth") if seconds else "-"
        share = seconds / job.runtime if job.runtime else done / job.bytes if job.bytes else None
        say(f"{rw}: {units.format_size(done)} moved ({rate})",
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
