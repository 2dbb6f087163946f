"""Drive health around every workload family: the NVMe SMART / health log (`nvme smart-log -o
json`) before and after, judged as AutoVal's nvme_validate does (docs/ARCHITECTURE.md §9,
AutoVal): critical warning zero, no new media errors, temperature below the
drive's warning threshold, spare above its threshold, no new thermal-management transitions;
new error-log entries are recorded. Two bounds hold in every profile (standing criteria),
wherever the drive has a SMART log: no critical warning bit set (a drive's own statement that
it is failing is never informational; the verdict names each bit), and the bytes the drive
counted as written agree with the bytes the kernel sent it, within the data unit's rounding. While the family runs, the composite temperature is sampled (with
the device's own throughput from its counters), so that the hottest moment counts, not only
the two ends."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass

from qual.family import Family, Field, Watcher
from qual.measurement import Measurement, Metric, Param, Standing, measure, measurement_id
from qual.targets import drive_status, nvme
from qual.workloads import registry

NAME = "health"
SAMPLE_EVERY_S = 2.0  # the temperature trace's interval
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
           "the drive's warning temperature less its hottest composite reading (sampled "
           "through the workload)"),
    Metric("health_thermal_transitions", "count", "lower", (_FAM,),
           "new thermal-management transitions (SMART HCTM TMT1 + TMT2, and the OCP log's "
           "thermal throttling events where the OCP plugin reads it)"),
    Metric("health_spare_headroom", "ratio", "higher", (_FAM,),
           "available spare above the drive's spare threshold, after the workload"),
    Metric("health_host_written", "size", "lower", (_FAM,),
           "bytes the drive counted as written during the workload (data units x 512,000)"),
    Metric("health_written_unaccounted", "size", "lower", (_FAM,),
           "how far the drive's count of bytes written (SMART data units) is from the bytes "
           "the kernel sent it (/sys/block/*/stat), beyond one data unit of rounding"),
)}

# SMART / Health Information log, byte 0 (NVMe base specification, Critical Warning)
WARNING_BITS = {
    0: "available spare below its threshold",
    1: "temperature outside a threshold (over- or under-temperature)",
    2: "NVM subsystem reliability degraded (media or internal errors)",
    3: "media placed in read-only mode",
    4: "volatile memory backup device failed",
    5: "persistent memory region read-only",
}


def warning_bits(value: int, *, temperature_k: int | None = None,
                 threshold_k: int | None = None) -> str:
    """The set bits of a critical warning byte, each named; bit 1 with the composite
    temperature and the over-temperature threshold it crossed, where known."""
    named = []
    for bit in range(8):
        if value & (1 << bit):
            what = WARNING_BITS.get(bit, "reserved")
            if bit == 1 and temperature_k is not None:
                what += f": composite {temperature_k} K"
                if threshold_k is not None:
                    what += (f", over-temperature threshold {threshold_k} K (Get Features 04h, "
                             "Temperature Threshold)")
            named.append(f"bit {bit} ({what})")
    return ", ".join(named)


def _warning_standing(after: Snapshot, threshold_k: int | None) -> Standing:
    if not after.critical_warning:
        why = ("the drive's own critical warning (SMART byte 0): any set bit is the drive "
               "saying it is failing")
    else:
        why = "the drive says it is failing: critical warning " + warning_bits(
            after.critical_warning, temperature_k=after.temperature_k, threshold_k=threshold_k)
    return Standing("max", 0, why)

FIELDS = (Field("families", "choices",
                help="the workload families whose suites are watched (default: every "
                     "registered family with a workload)"),)


def watched(table: dict | None) -> list[str]:
    """The families a profile's [health] table watches: those it names, else every registered
    family that runs a workload (one added through QUAL_FAMILIES included)."""
    if table and table.get("families"):
        return list(table["families"])
    return _watchable()


def _watchable() -> list[str]:
    """Families with a workload whose drive stays up through it: a power cut restarts the
    drive's SMART counters and the kernel's, so nothing before compares with after."""
    return [name for name, f in registry().items() if f.run is not None and not f.restarts_drive]


def _check(table: dict) -> list[tuple[str, str]]:
    runs = _watchable()
    return [("families", f"{name!r} is not a registered family with a workload the drive "
                         f"stays up through (one of {', '.join(runs)})")
            for name in table.get("families") or () if name not in runs]


def _cells(table: dict) -> list[str]:
    return [measurement_id(m, {"family": f}) for f in watched(table) for m in METRICS.values()]


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
    thermal_transitions: int  # thm_temp1_trans_count + thm_temp2_trans_count

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
                   data_units_written=field("data_units_written"),
                   thermal_transitions=field("thm_temp1_trans_count") +
                   field("thm_temp2_trans_count"))


def ocp_throttling(doc: dict) -> tuple[int, int]:
    """(thermal throttling events, current throttling status) from the OCP plugin's SMART /
    Health Information Extended log (`nvme ocp smart-add-log -o json`, log C0h); nvme-cli
    versions spell the keys in different cases. ValueError naming a missing field."""
    lower = {str(k).lower(): v for k, v in doc.items()}
    out = []
    for key in ("Number of Thermal throttling events", "Current throttling status"):
        v = lower.get(key.lower())
        if isinstance(v, str):
            v = int(v, 0) if v.strip() else None
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"OCP smart-add-log JSON: {key!r} is {v!r}, not a whole number")
        out.append(v)
    return out[0], out[1]


def read_ocp_throttling(device: str) -> tuple[int, int] | None:
    """The OCP log's throttling counters, or None where the drive or nvme-cli has no OCP log."""
    log = nvme.ocp_smart_add_log(device)
    try:
        return ocp_throttling(log) if log is not None else None
    except ValueError:
        return None


def unavailable(identity) -> str | None:
    """Why no SMART log can be read for a target (None: it can)."""
    if identity.transport != "nvme" or not identity.device:
        return f"not an NVMe device ({identity.transport or 'unknown transport'})"
    if not nvme.available():
        return nvme.INSTALL
    return None


def read_smart_log(device: str) -> Snapshot:
    return Snapshot.from_json(nvme.smart_log(device))


def measurements(family: str, before: Snapshot, after: Snapshot, *, target: str,
                 wctemp_k: int | None, kernel_written: int | None,
                 failed_writes: int | None = None, raw: bool = True,
                 trace: list[dict] | None = None, trace_problem: str | None = None,
                 ocp: tuple[tuple[int, int] | None, tuple[int, int] | None] = (None, None),
                 threshold_k: int | None = None) -> list[Measurement]:
    """What changed over one family's run, as measurements judged by the [health] criteria
    and the standing ones. `trace`: the temperature samples taken while it ran (their hottest
    counts); `failed_writes`: bytes of writes the drive failed meanwhile (the kernel counts
    them as sent, the drive as nothing written); `raw`: qual alone decided the commands (a
    block device target), so the drive's count may be neither more nor less than the kernel's;
    `ocp`: the OCP log's (throttling events, status) before and after, where it could
    be read; `threshold_k`: the over-temperature threshold the controller holds (Get Features
    04h), named where the temperature bit is set."""
    p = {"family": family}
    warning = wctemp_k or DEFAULT_WCTEMP_K
    hottest = max([before.temperature_k, after.temperature_k] +
                  [t["temperature_k"] for t in trace or []])
    written = (after.data_units_written - before.data_units_written) * DATA_UNIT
    transitions = after.thermal_transitions - before.thermal_transitions
    ocp_before, ocp_after = ocp
    if ocp_before and ocp_after:
        transitions += ocp_after[0] - ocp_before[0]
    ctx = {"target": target, "before": before.__dict__, "after": after.__dict__,
           "wctemp_k": warning, "wctemp_source": "id-ctrl" if wctemp_k else "AutoVal 348 K",
           "critical_warning_changed": before.critical_warning != after.critical_warning,
           "kernel_written_bytes": kernel_written, "hottest_k": hottest,
           "temperature_trace": trace or [], "temperature_trace_problem": trace_problem,
           "ocp_throttling": None if not ocp_after else {
               "events_before": ocp_before and ocp_before[0], "events_after": ocp_after[0],
               "status_after": ocp_after[1]}}
    out = [
        measure(NAME, METRICS["health_critical_warning"], p, after.critical_warning, context=ctx,
                standing=_warning_standing(after, threshold_k)),
        measure(NAME, METRICS["health_media_errors"], p,
                after.media_errors - before.media_errors, context=ctx),
        measure(NAME, METRICS["health_error_log_entries"], p,
                after.error_log_entries - before.error_log_entries, context=ctx),
        measure(NAME, METRICS["health_temperature_headroom"], p, warning - hottest, context=ctx),
        measure(NAME, METRICS["health_thermal_transitions"], p, transitions, context=ctx),
        measure(NAME, METRICS["health_spare_headroom"], p,
                (after.avail_spare - after.spare_thresh) / 100, context=ctx),
        measure(NAME, METRICS["health_host_written"], p, written, context=ctx),
    ]
    if kernel_written is not None:
        # the drive counts thousands of 512-byte units, each count rounded up: two readings'
        # difference is within one unit of what was written between them; a write it failed
        # the kernel counts as sent, the drive as nothing written
        done = kernel_written - (failed_writes or 0)
        less = f" less {failed_writes:,} B of writes it failed" if failed_writes else ""
        ctx["failed_writes_bytes"] = failed_writes
        off = written - done
        if raw:
            agree = "they agree within one unit"
        else:  # a filesystem may zero blocks with Write Zeroes, which the kernel counts as
            #    written and a drive may not (NVMe: they do not count as data units written)
            off, agree = max(off, 0), ("it counted no more, within one unit (on a filesystem, "
                                       "Write Zeroes count for the kernel alone)")
        out.append(measure(NAME, METRICS["health_written_unaccounted"], p,
                           max(0, abs(off) - DATA_UNIT), context=ctx,
                           standing=Standing(
                               "max", 0, f"the drive counted {written:,} B written "
                               f"({after.data_units_written - before.data_units_written} data "
                               f"units of {DATA_UNIT:,} B), the kernel sent it "
                               f"{kernel_written:,} B{less}: {agree}")))
    return out


def failed_writes(identity, since: float) -> int:
    """Bytes of the write commands the drive failed since `since` (the NVMe driver's log of
    each: qual.targets.drive_status)."""
    return sum(int(e["blocks"]) * identity.logical_block_size
               for e in drive_status.logged_errors(identity.device, since)
               if int(e["opcode"], 16) in (0x01, 0x08))  # Write, Write Zeroes


class TemperatureTrace:
    """The composite temperature every SAMPLE_EVERY_S while a family runs, beside the bytes
    the device counted (its own throughput), on a helper thread; stop() ends it (and waits
    at most one sample's nvme-cli call)."""

    def __init__(self, target, every: float = SAMPLE_EVERY_S):
        self.target, self.every = target, every
        self.samples: list[dict] = []
        self.problem: str | None = None
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="qual-temperature", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                snap = read_smart_log(self.target.identity.device)
            except (ValueError, OSError, subprocess.TimeoutExpired) as e:
                self.problem = str(e)  # a gap in the trace, said in the record; the ends
                continue               # are read all the same
            stat = self.target.device_stat()
            self.samples.append({
                "t_s": time.monotonic() - self._t0, "temperature_k": snap.temperature_k,
                "read_bytes": stat.read_bytes if stat else None,
                "write_bytes": stat.write_bytes if stat else None})

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(65)  # read_smart_log's own timeout bounds one sample
        return list(self.samples)


class Watch:
    """One family's run on one target: the SMART log (and the OCP log where there is one)
    when it starts and when it ends, and the temperature between."""

    def __init__(self, target, family: str):
        self.target, self.family = target, family
        why = unavailable(target.identity)
        self.reason = f"no SMART health log: {why}" if why else None
        self.before = None if self.reason else read_smart_log(target.identity.device)
        self.ocp_before = None if self.reason else read_ocp_throttling(target.identity.device)
        self.device_before = target.device_stat()
        self.started = time.monotonic()
        self.trace = None if self.reason else TemperatureTrace(target)

    def stop(self) -> None:
        if self.trace:
            self.trace.stop()

    def measurements(self) -> list[Measurement]:
        if self.reason:
            raise LookupError(self.reason)
        trace = self.trace.stop()
        after = read_smart_log(self.target.identity.device)
        ocp_after = read_ocp_throttling(self.target.identity.device)
        device_after = self.target.device_stat()
        kernel = failed = None
        if self.device_before is not None and device_after is not None:
            kernel = device_after.since(self.device_before)["write_bytes"]
            failed = failed_writes(self.target.identity, self.started)
        ctrl = self.target.identity.nvme_id_ctrl or {}
        threshold = nvme.temperature_threshold(f"/dev/{self.target.identity.device}") \
            if after.critical_warning & 0b10 else None
        return measurements(self.family, self.before, after, target=str(self.target.path),
                            wctemp_k=ctrl.get("wctemp") or None, kernel_written=kernel,
                            failed_writes=failed, raw=self.target.kind == "block", trace=trace, trace_problem=self.trace.problem,
                            ocp=(self.ocp_before, ocp_after), threshold_k=threshold)

    def charts(self) -> dict[str, bytes]:
        """The temperature trace beside the device's throughput, once it has two samples."""
        trace = self.trace.samples if self.trace else []
        if len(trace) < 2:
            return {}
        wctemp = (self.target.identity.nvme_id_ctrl or {}).get("wctemp") or DEFAULT_WCTEMP_K
        return {"temperature and throughput": temperature_chart(
            trace, wctemp, f"{self.family}: drive temperature through the suite")}


def temperature_chart(trace: list[dict], wctemp_k: int, title: str) -> bytes:
    """Composite temperature over the run, with the device's throughput between samples."""
    from qual.charts import png, subplots

    fig, ax = subplots(figsize=(7, 3.6))
    t = [s["t_s"] for s in trace]
    ax.plot(t, [s["temperature_k"] - 273 for s in trace], color="tab:red", marker=".",
            label="composite temperature")
    ax.axhline(wctemp_k - 273, color="tab:red", linestyle="--", label="warning (WCTEMP)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("temperature (°C)")
    moved = [(b["t_s"], ((b["read_bytes"] or 0) + (b["write_bytes"] or 0) - (a["read_bytes"] or 0)
                         - (a["write_bytes"] or 0)) / (b["t_s"] - a["t_s"]) / (1 << 20))
             for a, b in zip(trace, trace[1:]) if b["t_s"] > a["t_s"]]
    if moved:
        bx = ax.twinx()
        bx.plot([m[0] for m in moved], [m[1] for m in moved], color="tab:blue",
                label="throughput (device counters)")
        bx.set_ylabel("throughput (MiB/s)")
        bx.legend(loc="lower right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title)
    return png(fig)


FAMILY = Family(name=NAME, description="NVMe SMART health before and after each workload",
                fields=FIELDS, metrics=METRICS, check=_check, cells=_cells,
                watch=Watcher(start=Watch, covers=lambda table, family: family in watched(table)))
