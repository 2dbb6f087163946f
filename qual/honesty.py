"""Measurement honesty (docs/ARCHITECTURE.md §6): a number must have measured the device, not a
cache, and must not be faster than the hardware can be; a tail percentile needs enough samples."""

from __future__ import annotations

import errno
import math
import re

from qual.engine import IoResult, run_job
from qual.errors import ImplausibleMeasurement
from qual.targets import DeviceStat, Identity
from qual.units import format_quantity

DEVICE_SHARE = 0.9  # the device must see at least this share of the bytes a job moved
COUNTED = "counted"  # device_truth of a measurement the device's own counters confirmed
NO_DEVICE = ("unavailable: no block device counters under the target (tmpfs, overlay, FUSE or "
             "a network filesystem)")
LINK_SLACK = 1.02  # clock and counting noise allowed above the link's payload ceiling


def _implausible(message: str, target: str) -> ImplausibleMeasurement:
    return ImplausibleMeasurement(errno.EBADE, message, target=target)


def link_ceiling(identity: Identity) -> float | None:
    """Payload bytes/s a PCIe link can carry (speed x width x line-code efficiency), if known."""
    if not identity.link_speed or not identity.link_width:
        return None
    m = re.match(r"([\d.]+)\s*GT/s", identity.link_speed)
    if not m or not identity.link_width.isdigit():
        return None
    gts = float(m.group(1))
    efficiency = 8 / 10 if gts <= 5.0 else 128 / 130  # 8b/10b up to Gen2, 128b/130b after
    return gts * 1e9 * efficiency / 8 * int(identity.link_width)


def check_link(bw: float, identity: Identity, target: str, what: str) -> None:
    """Raise ImplausibleMeasurement when `what` at bw bytes/s is more than the link carries."""
    ceiling = link_ceiling(identity)
    if ceiling and bw > ceiling * LINK_SLACK:
        raise _implausible(f"{what} at {bw / 1e9:.3g} GB/s exceeds what the link can carry "
                           f"({ceiling / 1e9:.3g} GB/s)", target)


def between(before: DeviceStat | None, after: DeviceStat | None) -> dict | None:
    """What the block device counted between two snapshots; None where there is no block
    device to ask (a tmpfs, a FUSE mount)."""
    return after.since(before) if before is not None and after is not None else None


def check_device(seen: dict | None, key: str, moved: int, what: str, target: str) -> dict:
    """Device truth: bytes a workload says went to (or came from) the device must show in the
    device's own `key` counter (read_bytes, write_bytes), at least DEVICE_SHARE of them; else
    a cache served them and the figure is not the device's. Returns what was checked."""
    if seen is None:
        return {"device_truth": NO_DEVICE}
    if seen[key] < DEVICE_SHARE * moved:
        raise _implausible(
            f"the device counted {format_quantity(seen[key], dimension='size')} of "
            f"{format_quantity(moved, dimension='size')} of {what}: they did not reach the "
            "device (a cache served them)", target)
    return {"device_truth": COUNTED, "device_bytes": seen[key],
            "device_utilisation": seen.get("utilisation")}


def unproven(truth: str | None) -> str | None:
    """Why a measurement's claim on the device (its `device_truth`) is not proven by the
    device's own counters (None: proven, or the measurement makes no claim on the device)."""
    return None if truth in (None, COUNTED) else truth


def check_io(result: IoResult, device: dict | None, identity: Identity) -> dict:
    """Raise ImplausibleMeasurement for a result that cannot be the device's; else return what
    was checked (recorded next to the measurement)."""
    job = result.job
    if result.ops == 0:
        raise _implausible(f"no I/O completed in {result.elapsed:.3g} s", job.target)
    checked = {"path": "O_DIRECT" if job.direct else "page cache", "backend": result.backend}
    ceiling = link_ceiling(identity)
    if ceiling:
        checked["link_ceiling_bw"] = ceiling
        if result.bandwidth > ceiling * LINK_SLACK:
            raise _implausible(
                f"{job.rw} at {format_quantity(result.bandwidth, 'GiB/s')} exceeds what a "
                f"{identity.link_speed} x{identity.link_width} link can carry "
                f"({format_quantity(ceiling, 'GiB/s')})", job.target)
    if job.op != "mixed":
        key = "read_bytes" if job.op == "read" else "write_bytes"
        return {**checked, **check_device(device, key, result.bytes if job.direct else 0,
                                          f"O_DIRECT {job.rw}", job.target)}
    # each direction on its own counter: a cache that absorbed the writes cannot hide behind
    # the reads' bytes
    reads = check_device(device, "read_bytes", result.read.bytes if job.direct else 0,
                         f"the reads of O_DIRECT {job.rw}", job.target)
    writes = check_device(device, "write_bytes", result.write.bytes if job.direct else 0,
                          f"the writes of O_DIRECT {job.rw}", job.target)
    return {**checked, **reads, "device_write_bytes": writes.get("device_bytes")}


def run_checked(target, job, progress=None) -> tuple[IoResult, dict]:
    """Prepare and run a job on a target, and check what it did against the device's own
    counters and the link: the result, and what was checked (ImplausibleMeasurement if the
    result cannot be the device's). `progress(bytes, ops, seconds)` hears how far it is."""
    job = target.prepare(job)
    written = written_under(target, job)
    before = target.device_stat()
    result = run_job(job, progress=progress, interval=1.0)
    checked = check_io(result, between(before, target.device_stat()), target.identity)
    return result, checked if written is None else {**checked, "region_written": written}


def written_under(target, job) -> int | None:
    """Bytes of a reading job's region on a block device that this run had written before the
    job began (a drive answers blocks never written without touching its media, so reads of
    them are not the drive's); None for a file, whose region is always written, or a job that
    only writes."""
    if target.kind != "block" or job.op == "write":
        return None
    return max(0, min(target.written, job.offset + job.size) - job.offset)


def samples_needed(pct: float) -> int:
    """Samples for the pct-th percentile to be distinct from the maximum (p99.99: 10,000)."""
    if pct >= 100:
        return 1
    return math.ceil(1 / (1 - pct / 100) - 1e-9)
