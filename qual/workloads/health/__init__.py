"""Drive health around every workload family: the NVMe SMART / health log (`nvme smart-log -o
json`) before and after, judged as AutoVal's nvme_validate does (reference/storage-
qualification.md §4.2): critical warning zero, no new media errors, temperature below the
drive's warning threshold, spare above its threshold; new error-log entries and the bytes the
drive counted as written are recorded next to the bytes the kernel sent it."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass

from qual.workloads.base import Family
from qual.family import Field, Metric, Param, measurement_id
from qual.record import Measurement, measure

NAME = "health"
WATCHED = ("bandwidth", "checkpoint", "gnn", "training", "integrity")
DATA_UNIT = 512_000  # NVMe: data units are thousands of 512-byte units, rounded up
DEFAULT_WCTEMP_K = 348  # AutoVal's bound (75 °C) where the drive reports no WCTEMP
_FAM = Param("family", "name")

METRICS = {m.name: m for m in (
    Metric("health_critical_warning", "count", "lower", (_FAM,),
           "critical warning bits after the workload (any set bit is a warning)"),
    Metric("health_media_errors", "count", "lower", (_FAM,),
           "new media and data integrity errors during the workload"),
    Metric("health_error_log_entries", "count", "lower", (_FAM,),
           "new error information log entries during the workload"),
    Metric("health_temperature_headroom", "temperature", "higher", (_FAM,),
           "the drive's warning temperature less its hottest composite reading"),
    Metric("health_spare_headroom", "ratio", "higher", (_FAM,),
           "available spare above the drive's spare threshold, after the workload"),
    Metric("health_host_written", "size", "lower", (_FAM,),
           "bytes the drive counted as written during the workload (data units x 512,000)"),
)}

FIELDS = (Field("families", "choices", default=list(WATCHED), choices=WATCHED,
                help="the workload families whose runs are watched"),)


def _cells(table: dict) -> list[str]:
    return [measurement_id(m, {"family": f}) for f in table["families"] for m in METRICS.values()]


FAMILY = Family(name=NAME, description="NVMe SMART health before and after each workload",
                fields=FIELDS, metrics=METRICS, cells=_cells)


@dataclass(frozen=True)
class Snapshot:
    """The fields of one `nvme smart-log -o json` that qual judges."""

    critical_warning: int
    temperature_k: int
    avail_spare: int
    spare_thresh: int
    percent_used: int
    media_errors: int
    error_log_entries: int
    data_units_written: int

    @classmethod
    def from_json(cls, doc: dict) -> Snapshot:
        """Parse nvme-cli's JSON (critical_warning is an int, or an object with `value` under
        -v); ValueError naming a missing or malformed field."""
        def field(key: str) -> int:
            v = doc.get(key)
            if isinstance(v, dict):
                v = v.get("value")
            if isinstance(v, str) and v.strip().lstrip("-").isdigit():
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"smart-log JSON: {key} is {v!r}, not a whole number")
            return v

        return cls(critical_warning=field("critical_warning"), temperature_k=field("temperature"),
                   avail_spare=field("avail_spare"), spare_thresh=field("spare_thresh"),
                   percent_used=field("percent_used"), media_errors=field("media_errors"),
                   error_log_entries=field("num_err_log_entries"),
                   data_units_written=field("data_units_written"))


def unavailable(identity) -> str | None:
    """Why no SMART log can be read for a target (None: it can)."""
    if identity.transport != "nvme" or not identity.device:
        return f"not an NVMe device ({identity.transport or 'unknown transport'})"
    if shutil.which("nvme") is None:
        return "nvme-cli is not installed (Debian: apt-get install nvme-cli)"
    return None


def read_smart_log(device: str) -> Snapshot:
    out = subprocess.run(["nvme", "smart-log", f"/dev/{device}", "-o", "json"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise ValueError(f"nvme smart-log /dev/{device}: {out.stderr.strip() or out.returncode}")
    return Snapshot.from_json(json.loads(out.stdout))


def measurements(family: str, before: Snapshot, after: Snapshot, *, target: str,
                 wctemp_k: int | None, kernel_written: int | None) -> list[Measurement]:
    """What changed over one family's run, as measurements judged by the [health] criteria."""
    p = {"family": family}
    warning = wctemp_k or DEFAULT_WCTEMP_K
    hottest = max(before.temperature_k, after.temperature_k)
    written = (after.data_units_written - before.data_units_written) * DATA_UNIT
    ctx = {"target": target, "before": before.__dict__, "after": after.__dict__,
           "wctemp_k": warning, "wctemp_source": "id-ctrl" if wctemp_k else "AutoVal 348 K",
           "critical_warning_changed": before.critical_warning != after.critical_warning,
           "kernel_written_bytes": kernel_written}
    return [
        measure(NAME, METRICS["health_critical_warning"], p, after.critical_warning, context=ctx),
        measure(NAME, METRICS["health_media_errors"], p,
                after.media_errors - before.media_errors, context=ctx),
        measure(NAME, METRICS["health_error_log_entries"], p,
                after.error_log_entries - before.error_log_entries, context=ctx),
        measure(NAME, METRICS["health_temperature_headroom"], p, warning - hottest, context=ctx),
        measure(NAME, METRICS["health_spare_headroom"], p,
                (after.avail_spare - after.spare_thresh) / 100, context=ctx),
        measure(NAME, METRICS["health_host_written"], p, written, context=ctx),
    ]


class Watch:
    """One family's run on one target: the SMART log when it starts and when it ends."""

    def __init__(self, target, family: str):
        self.target, self.family = target, family
        self.reason = unavailable(target.identity)
        self.before = None if self.reason else read_smart_log(target.identity.device)
        self.device_before = target.device_stat()

    def measurements(self) -> list[Measurement]:
        if self.reason:
            raise LookupError(self.reason)
        after = read_smart_log(self.target.identity.device)
        device_after = self.target.device_stat()
        kernel = None
        if self.device_before is not None and device_after is not None:
            kernel = device_after.since(self.device_before)["write_bytes"]
        ctrl = self.target.identity.nvme_id_ctrl or {}
        return measurements(self.family, self.before, after, target=str(self.target.path),
                            wctemp_k=ctrl.get("wctemp") or None, kernel_written=kernel)
