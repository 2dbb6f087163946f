"""A checkpoint run's results as measurements (by section: MLPerf's runs, passes, restore,
torch baseline) and as the outcome the command and the suite read."""

from __future__ import annotations

from pathlib import Path

from qual import honesty
from qual.exits import Exit
from qual.measurement import Measurement, measure
from qual.workloads.base import ResultOutcome
from qual.workloads.checkpoint import charts
from qual.workloads.checkpoint.spec import GIB, METRICS, NAME


def pass_measurements(result: dict, target: str) -> list[Measurement]:
    """Per pass: mean seconds per checkpoint, that as bandwidth, slowest rank's bandwidth;
    per checkpoint: its seconds (informational)."""
    out = []
    size = result["checkpoints"][0]["bytes"] if result["checkpoints"] else 0
    common = {"target": target, "backend": result["checkpoints"][0]["backend"] if size else None,
              "world": result["world"], "plan": result["plan"], "per_pass": result["per_pass"],
              "data_period": result["data_period"]}
    out.append(measure(NAME, METRICS["ckpt_size"], {}, size, context=common))
    for p in range(1, result["passes"] + 1):
        mine = [c for c in result["checkpoints"] if c["pass"] == p]
        truths = []
        for c in mine:
            checked = honesty.check_device(c["device"], "write_bytes", c["bytes"],
                                           "checkpoint writes", target)
            truths.append(checked["device_truth"])
            out.append(measure(NAME, METRICS["ckpt_each_s"], {"pass": p, "index": c["index"]},
                               c["seconds"], context={**common, "name": c["name"],
                                                      "rank_seconds": c["rank_seconds"],
                                                      "device": c["device"], **checked}))
        seconds = [c["seconds"] for c in mine]
        mean = sum(seconds) / len(seconds)
        slowest = [min(b / s for b, s in zip(c["rank_bytes"], c["rank_seconds"])) for c in mine]
        ctx = {**common, "checkpoints": len(mine),  # proven only if every checkpoint is
               "device_truth": next((t for t in truths if t != honesty.COUNTED),
                                    honesty.COUNTED)}
        out.append(measure(NAME, METRICS["ckpt_write_s"], {"pass": p}, mean, context=ctx,
                           samples=seconds))
        out.append(measure(NAME, METRICS["ckpt_write_bw"], {"pass": p}, size / mean, context=ctx,
                           samples=[size / s for s in seconds]))
        out.append(measure(NAME, METRICS["ckpt_rank_bw_min"], {"pass": p},
                           sum(slowest) / len(slowest), context=ctx, samples=slowest))
    return out


def restore_measurements(result: dict, target: str) -> list[Measurement]:
    r = result["restore"]
    ctx = {"target": target, "checkpoint": r["path"], "errors": r["errors"],
           "verified_bytes": r["verified_bytes"], "device": r["device"]}
    out = [measure(NAME, METRICS["ckpt_restore_intact"], {}, 1.0 if r["intact"] else 0.0,
                   context=ctx)]
    if r["bytes"]:
        ctx = {**ctx, **honesty.check_device(r["device"], "read_bytes", r["bytes"],
                                             "restore reads", target)}
        out += [measure(NAME, METRICS["ckpt_restore_s"], {}, r["seconds"], context=ctx),
                measure(NAME, METRICS["ckpt_restore_bw"], {}, r["bytes"] / r["seconds"],
                        context=ctx)]
    return out


def baseline_measurements(result: dict, target: str) -> list[Measurement]:
    t = result["torch"]
    seen = t["load_device"]
    cold = None if seen is None else \
        seen["read_bytes"] >= honesty.DEVICE_SHARE * t["file_bytes"]  # None: nobody counted
    ctx = {"target": target, "bytes": t["bytes"], "file_bytes": t["file_bytes"],
           "save_s": t["save_s"], "load_s": t["load_s"], "load_from_device": cold,
           "round_trip_equal": t["round_trip_equal"],
           "device_truth": honesty.NO_DEVICE if cold is None else honesty.COUNTED if cold
           else "not from the device: torch.load was served by the page cache"}
    save_bw, load_bw = t["bytes"] / t["save_s"], t["bytes"] / t["load_s"]
    out = [measure(NAME, METRICS["torch_save_bw"], {}, save_bw, context=ctx),
           measure(NAME, METRICS["torch_load_bw"], {}, load_bw, context=ctx)]
    passes = [m for m in pass_measurements(result, target) if m.metric == "ckpt_write_bw"]
    if passes:
        native = sum(m.value for m in passes) / len(passes)
        out.append(measure(NAME, METRICS["ckpt_save_speedup"], {}, native / save_bw,
                           context={**ctx, "native_write_bw": native}))
    if result["restore"] and result["restore"]["bytes"]:
        native = result["restore"]["bytes"] / result["restore"]["seconds"]
        out.append(measure(NAME, METRICS["ckpt_load_speedup"], {}, native / load_bw,
                           context={**ctx, "native_restore_bw": native}))
    return out


def _slowest(rec: dict) -> tuple[float, float]:
    """MLPerf's figures of one checkpoint: the slowest rank's seconds and the slowest rank's
    throughput (the minimum over ranks of its bytes over its seconds)."""
    return max(rec["rank_seconds"]), min(b / s for b, s in zip(rec["rank_bytes"],
                                                              rec["rank_seconds"]) if s > 0)


def mlperf_summary(result: dict) -> dict:
    """Per run and over the runs, the four figures under DLIO's summary names (GB = GiB)."""
    runs = []
    for r in result["mlperf"]:
        w = [_slowest(c) for c in r["writes"]]
        rd = [_slowest(c) for c in r["reads"] if c["bytes"]]
        mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
        runs.append({
            "run": r["run"], "checkpoints_written": len(w), "checkpoints_read": len(rd),
            "verified": all(c["intact"] for c in r["reads"]),
            "read_bytes": sum(c["bytes"] for c in r["reads"]),
            # the cache clear's proof: what the device itself counted (None: no device to ask)
            "device_read_bytes": None if any(c["device"] is None for c in r["reads"])
            else sum(c["device"]["read_bytes"] for c in r["reads"]),
            "save_checkpoint_duration_mean_seconds": mean([d for d, _ in w]),
            "save_checkpoint_io_mean_GB_per_second": mean([t for _, t in w]) / GIB,
            "load_checkpoint_duration_mean_seconds": mean([d for d, _ in rd]),
            "load_checkpoint_io_mean_GB_per_second": mean([t for _, t in rd]) / GIB,
            "errors": [e for c in r["reads"] for e in c["errors"]]})
    keys = [k for k in runs[0] if k.endswith(("_seconds", "_second"))] if runs else []
    return {"runs": runs, "verified": bool(runs) and all(r["verified"] for r in runs),
            **{k: sum(r[k] for r in runs) / len(runs) for k in keys}}


def mlperf_measurements(result: dict, target: str) -> list[Measurement]:
    """The MLPerf figures per run and over the runs; every write and every read checked
    against the device's own counters (a read the page cache served is not a read)."""
    summary = mlperf_summary(result)
    common = {"target": target, "world": result["world"], "plan": result["plan"],
              "checkpoints_per_run": result["per_pass"], "procedure": "mlperf-v2"}
    truths = []
    for r in result["mlperf"]:
        for c in r["writes"]:
            truths.append(honesty.check_device(c["device"], "write_bytes", c["bytes"],
                                               "checkpoint writes", target)["device_truth"])
        for c in r["reads"]:
            if c["bytes"]:
                truths.append(honesty.check_device(c["device"], "read_bytes", c["bytes"],
                                                   "checkpoint reads (cache cleared)",
                                                   target)["device_truth"])
    ctx = {**common, "device_truth": next((t for t in truths if t != honesty.COUNTED),
                                          honesty.COUNTED)}
    names = {"save_checkpoint_duration": "save_checkpoint_duration_mean_seconds",
             "save_checkpoint_io": "save_checkpoint_io_mean_GB_per_second",
             "load_checkpoint_duration": "load_checkpoint_duration_mean_seconds",
             "load_checkpoint_io": "load_checkpoint_io_mean_GB_per_second"}
    out = []
    for metric, key in names.items():
        scale = GIB if key.endswith("_second") else 1  # GiB/s to bytes/s
        out.append(measure(NAME, METRICS[metric], {}, summary[key] * scale,
                           context={**ctx, "mlperf_name": key,
                                    "runs": [r[key] for r in summary["runs"]]},
                           samples=[r[key] * scale for r in summary["runs"]]))
    out.append(measure(NAME, METRICS["ckpt_restore_intact"], {},
                       1.0 if summary["verified"] else 0.0,
                       context={**common, "errors": [e for r in summary["runs"]
                                                     for e in r["errors"]]}))
    return out


SECTIONS = {"mlperf": mlperf_measurements, "passes": pass_measurements,
            "restore": restore_measurements, "baseline": baseline_measurements}


class CheckpointOutcome(ResultOutcome):
    """Rank 0's results (a dict, as the ranks report them) and the protocol's views of them."""

    def measurements(self, section: str | None = None) -> list[Measurement]:
        """All, or one section: mlperf (the MLPerf procedure's runs), passes, restore, baseline
        (torch.save and torch.load)."""
        if section is not None:
            return SECTIONS[section](self.result, self.target)
        if self.result.get("mlperf") is not None:
            return mlperf_measurements(self.result, self.target)
        out = pass_measurements(self.result, self.target)
        if self.result["restore"]:
            out += restore_measurements(self.result, self.target)
        if self.result["torch"]:
            out += baseline_measurements(self.result, self.target)
        return out

    def document(self) -> dict:
        if self.result.get("mlperf") is not None:
            summary = mlperf_summary(self.result)
            plan = self.result["plan"]
            return {"procedure": "mlperf-v2", "bytes": sum(self.result["rank_bytes"]),
                    # MLPerf's checkpoint.mode: subset writes this host's share (node-local)
                    "mode": "subset" if plan.get("subset") else "default",
                    "full_bytes": plan.get("full_bytes", sum(self.result["rank_bytes"])),
                    "ranks": self.result["world"], "plan": plan,
                    "checkpoints_per_run": self.result["per_pass"], **summary,
                    "store": self.result["store"], "kept": self.result["kept"]}
        cps, r = self.result["checkpoints"], self.result["restore"]
        size = cps[0]["bytes"] if cps else r["bytes"] if r else 0  # read-only: what it restored
        seconds = [c["seconds"] for c in cps]
        doc = {"bytes": size, "ranks": self.result["world"], "plan": self.result["plan"],
               "backend": cps[0]["backend"] if cps else None, "write_s": seconds,
               "write_bw_bytes": size * len(seconds) / sum(seconds) if seconds else 0.0,
               "zero_copy_bytes": [c["zero_copy_bytes"] for c in cps],
               "store": self.result["store"], "kept": self.result["kept"]}
        if r:
            doc.update(restore_s=r["seconds"], restore_bw_bytes=r["bytes"] / r["seconds"]
                       if r["bytes"] else 0.0, verified=r["intact"], restore_errors=r["errors"],
                       crc_checked_bytes=r["bytes"], byte_compared_bytes=r["verified_bytes"],
                       restore_zero_copy_bytes=r["zero_copy_bytes"])
        t = self.result["torch"]
        if t:
            doc.update(torch_save_bw_bytes=t["bytes"] / t["save_s"],
                       torch_load_bw_bytes=t["bytes"] / t["load_s"])
        return doc

    def lines(self) -> list[str]:
        doc = self.document()
        if self.result.get("mlperf") is not None:
            return [f"run {r['run']}: {r['checkpoints_written']} writes "
                    f"{r['save_checkpoint_duration_mean_seconds']:.2f} s "
                    f"({r['save_checkpoint_io_mean_GB_per_second']:.2f} GiB/s), "
                    f"{r['checkpoints_read']} reads {r['load_checkpoint_duration_mean_seconds']:.2f} s "
                    f"({r['load_checkpoint_io_mean_GB_per_second']:.2f} GiB/s), verified: "
                    f"{r['verified']}" for r in doc["runs"]] + [
                f"MLPerf Storage v2.0 ({doc['mode']} mode, {doc['bytes'] / 2**30:.3f} of "
                f"{doc['full_bytes'] / 2**30:.3f} GiB; {len(doc['runs'])} runs, slowest rank): write "
                f"{doc['save_checkpoint_duration_mean_seconds']:.2f} s, "
                f"{doc['save_checkpoint_io_mean_GB_per_second']:.2f} GiB/s; read "
                f"{doc['load_checkpoint_duration_mean_seconds']:.2f} s, "
                f"{doc['load_checkpoint_io_mean_GB_per_second']:.2f} GiB/s; verified: "
                f"{doc['verified']}"]
        gb = doc["bytes"] / 1e9
        out = [f"checkpoint {i}: {gb:.3f} GB in {s:.2f} s ({gb / s:.2f} GB/s) [{doc['backend']}]"
               for i, s in enumerate(doc["write_s"], 1)]
        if self.result["restore"]:
            out.append(f"restore: {doc['restore_s']:.2f} s ({doc['restore_bw_bytes'] / 1e9:.2f} "
                       f"GB/s), intact: {doc['verified']} (CRC32C of every chunk, "
                       f"{doc['crc_checked_bytes'] / 1e9:.3f} GB; "
                       f"{doc['byte_compared_bytes'] / 1e9:.3f} GB of it byte for byte)")
            out += [f"  {e}" for e in doc["restore_errors"]]
        if self.result["torch"]:
            out.append(f"torch.save + fsync: {doc['torch_save_bw_bytes'] / 1e9:.2f} GB/s, "
                       f"torch.load: {doc['torch_load_bw_bytes'] / 1e9:.2f} GB/s")
        if doc["kept"]:
            out.append(f"kept in {doc['store']}: {', '.join(doc['kept'])}")
        if self.result["checkpoints"] and not self.result["restore"]:
            out.append(f"read it back (here or on another host) with: qual checkpoint "
                       f"--read-only {Path(doc['store']) / doc['kept'][-1]}")
        return out

    def charts(self) -> dict[str, bytes]:
        return {"seconds per checkpoint": charts.seconds_chart(self.result)} if self.result["checkpoints"] \
            else {}

    def exit_status(self) -> int:
        if self.result.get("mlperf") is not None:
            return Exit.PASS if mlperf_summary(self.result)["verified"] else Exit.FAIL
        return Exit.FAIL if self.result["restore"] and not self.result["restore"]["intact"] else Exit.PASS
