"""A training run's results as measurements (AU, samples/s, bandwidth, the most accelerators
a drive keeps busy, the dataset-size rule) and as the outcome the command and the suite read."""

from __future__ import annotations

from qual import honesty
from qual.family import in_section
from qual.workloads.base import ResultOutcome
from qual.measurement import Measurement, measure
from qual.targets import Target
from qual.units import format_size
from qual.workloads.training import charts
from qual.workloads.training.spec import METRICS, NAME


def caveats(result: dict, n: int) -> list[str]:
    rule = result["rule"][n]
    if rule["share"] >= 1:
        return []
    return [f"dataset below MLPerf Storage's size rule: {rule['files']} files < "
            f"{rule['minimum_files']} (500 steps x batch x {n} accelerator(s), 5x host RAM "
            f"{format_size(result['host_memory'])}); the page cache may have served reads"]


def _check_run(r: dict, target: Target) -> dict:
    """Honesty (docs/ARCHITECTURE.md §6): O_DIRECT bytes must reach the device; nothing beats the link."""
    checked = {"path": r["path"], "backend": r["backend"]}
    honesty.check_link(r["bw_bytes"], target.identity, target.spec, "training reads")
    seen = r["device_read_bytes"]
    device = None if seen is None else {"read_bytes": seen}
    return {**checked, **honesty.check_device(device, "read_bytes", r["bytes"] if r["path"] ==
                                              "O_DIRECT" else 0, "O_DIRECT sample reads",
                                              target.spec)}


def measurements(result: dict, target: Target) -> list[Measurement]:
    out = []
    name = str(target.path)
    for r in result["runs"]:
        n, e = r["accelerators"], r["epochs"]
        p = {"accelerators": n, "epochs": e}
        ctx = {"target": name, "workload": result["workload"]["name"],
               "steps_per_epoch": r["steps_per_epoch"], "shuffle_seed": result["shuffle_seed"],
               **_check_run(r, target)}
        said = caveats(result, n)
        calib = result["calibration"].get(n)
        au_ctx = {**ctx, "per_epoch": [x["au_mean"] for x in r["per_epoch"]]}
        # a criterion above what the simulator reaches without storage cannot be judged
        ceiling = calib["au_mean"] if calib else None
        out.append(measure(NAME, METRICS["train_au"], p, r["au_mean"], context=au_ctx,
                           samples=au_ctx["per_epoch"], caveats=said, ceiling=ceiling))
        out.append(measure(NAME, METRICS["train_au_min_epoch"], p, r["au_min_epoch"],
                           context=au_ctx, caveats=said, ceiling=ceiling))
        out.append(measure(NAME, METRICS["train_samples_per_s"], p, r["samples_per_s"],
                           context=ctx, caveats=said))
        out.append(measure(NAME, METRICS["train_bw"], p, r["bw_bytes"], context=ctx, caveats=said,
                           samples=[x["bw_bytes"] for x in r["per_epoch"]]))
        if r["device_read_bytes"] is not None and r["bytes"]:
            out.append(measure(NAME, METRICS["train_device_read_share"], p,
                               r["device_read_bytes"] / r["bytes"],
                               context={**ctx, "device": [x["device"] for x in r["per_epoch"]]}))
    for n, rule in result["rule"].items():
        out.append(measure(NAME, METRICS["train_dataset_share"], {"accelerators": n},
                           rule["share"], context={"target": name, **rule,
                                                   "host_memory": result["host_memory"]}))
    for n, c in result["calibration"].items():
        out.append(measure(NAME, METRICS["train_au_ceiling"], {"accelerators": n}, c["au_mean"],
                           context={"target": name, "steps_per_epoch": c["steps_per_epoch"]}))
    for e, best in result["max_accelerators"].items():
        out.append(measure(NAME, METRICS["train_max_accelerators"], {"epochs": e}, best,
                           context={"target": name, "au_floor": result["au_floor"],
                                    "swept": sorted({r["accelerators"] for r in result["runs"]})}))
    return out


# the suite records these apart: AU, throughput, the headline count, the dataset rule
SECTIONS = {"utilisation": ("train_au", "train_au_min_epoch", "train_au_ceiling"),
            "throughput": ("train_samples_per_s", "train_bw", "train_device_read_share"),
            "accelerators": ("train_max_accelerators",),
            "dataset": ("train_dataset_share",)}


class TrainingOutcome(ResultOutcome):
    """The sweep's results (a dict, as `run` assembles it) and the protocol's views of them."""

    def measurements(self, section: str | None = None) -> list[Measurement]:
        return in_section(measurements(self.result, self.target), SECTIONS, section)

    def document(self) -> dict:
        """The first sweep point: one accelerator count, one epochs value (as the CLI runs)."""
        r = self.result["runs"][0]
        n = r["accelerators"]
        calib = self.result["calibration"].get(n)
        return {"workload": self.result["workload"]["name"], "accelerators": n, "epochs": r["epochs"],
                "backend": r["backend"], "path": r["path"], "au_mean": r["au_mean"],
                "au_min_epoch": r["au_min_epoch"], "samples_per_s": r["samples_per_s"],
                "bw_bytes": r["bw_bytes"], "bytes": r["bytes"],
                "device_read_bytes": r["device_read_bytes"],
                "au_ceiling": calib["au_mean"] if calib else None,
                "steps_per_epoch": r["steps_per_epoch"], "shuffle_seed": self.result["shuffle_seed"],
                "dataset": self.result["dataset"], "dataset_rule": self.result["rule"][n],
                "caveats": caveats(self.result, n), "per_epoch": r["per_epoch"]}

    def lines(self) -> list[str]:
        doc = self.document()
        out = [f"epoch {e['epoch']}: AU {e['au_mean'] * 100:.1f} %, {e['samples_per_s']:.1f} "
               f"samples/s, {e['bw_bytes'] / 2**20:.0f} MiB/s, device read "
               + (format_size(e["device"]["read_bytes"]) if e["device"] else "unknown")
               for e in doc["per_epoch"]]
        ceiling = f", ceiling without storage {doc['au_ceiling'] * 100:.1f} %" \
            if doc["au_ceiling"] is not None else ""
        out.append(f"{doc['workload']}, {doc['accelerators']} accelerator(s) [{doc['backend']}, "
                   f"{doc['path']}]: AU mean {doc['au_mean'] * 100:.1f} %, lowest epoch "
                   f"{doc['au_min_epoch'] * 100:.1f} %{ceiling}; {doc['samples_per_s']:.1f} "
                   f"samples/s, {doc['bw_bytes'] / 2**20:.0f} MiB/s")
        out += [f"CAVEAT: {c}" for c in doc["caveats"]]
        return out

    def charts(self) -> dict[str, bytes]:
        return {"AU vs accelerators": charts.sweep_chart(self.result, "au"),
                "MiB/s vs accelerators": charts.sweep_chart(self.result, "bw")}
