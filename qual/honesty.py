"""Measurement honesty (DESIGN §6): a number must have measured the device, not a cache, and
must not be faster than the hardware can be; a tail percentile needs enough samples."""

from __future__ import annotations

import errno
import math
import re

from qual.engine import IoResult, QualError
from qual.target import Identity
from qual.units import format_quantity

DEVICE_SHARE = 0.9  # the device must see at least this share of the bytes a job moved
LINK_SLACK = 1.02  # clock and counting noise allowed above the link's payload ceiling


class ImplausibleMeasurement(QualError):
    """A result the hardware cannot have produced, or that the data cannot support."""


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
    if device is None:
        checked["device_truth"] = "unavailable (no block device under the target)"
        return checked
    seen = device["read_bytes"] if job.op == "read" else device["write_bytes"]
    checked.update(device_bytes=seen, device_utilisation=device["utilisation"])
    if job.direct and seen < DEVICE_SHARE * result.bytes:
        raise _implausible(
            f"the device {job.op} {format_quantity(seen, dimension='size')} while the job "
            f"{job.op} {format_quantity(result.bytes, dimension='size')}: the data came from a "
            "cache, not the device", job.target)
    return checked


def samples_needed(pct: float) -> int:
    """Samples for the pct-th percentile to be distinct from the maximum (p99.99: 10,000)."""
    if pct >= 100:
        return 1
    return math.ceil(1 / (1 - pct / 100) - 1e-9)
