"""DLIO's training workloads as published (dlio_benchmark/configs/workload/*.yaml, the same in
MLPerf Storage v1.0 and v2.0), MLPerf Storage v3.0's new ones (mlcommons/storage
configs/dlio/workload/*.yaml: RetinaNet, Flux, DLRM; reference/mlperf-storage-v3.md), seed
001's UNet3D variant, and MLPerf Storage's dataset-size rule (reference/dlio-mlperf-storage.md
§1.4, §2.2)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Workload:
    name: str
    files: int                # num_files_train
    samples_per_file: int
    record_length: int        # bytes per sample (mean)
    record_stdev: int         # bytes; per-file sizes are drawn from normal(mean, stdev)
    batch: int                # samples per step per accelerator
    read_threads: int         # data-loader threads per accelerator
    computation_time: float   # seconds of emulated compute per step
    epochs: int
    au_floor: float | None    # MLPerf's minimum accelerator utilisation (None: not set)
    source: str
    format: str               # the YAML's dataset.format (qual reads the bytes, parses nothing)

    @property
    def file_bytes(self) -> int:
        return self.samples_per_file * self.record_length

    def demand(self) -> float:
        """Bytes per second one accelerator consumes at 100 % AU."""
        return self.batch * self.record_length / self.computation_time if self.computation_time \
            else math.inf

    def scaled(self, *, files: int | None = None, record_scale: float = 1.0, **kw) -> Workload:
        """A smaller (or changed) copy for small targets: record length and its spread scale
        together; the sample count per file, threads and compute stay as published."""
        return replace(self, files=files or self.files,
                       record_length=max(1, round(self.record_length * record_scale)),
                       record_stdev=round(self.record_stdev * record_scale),
                       **{k: v for k, v in kw.items() if v is not None})


_UNET3D = dict(files=168, samples_per_file=1, record_length=146_600_628,
               record_stdev=68_341_808, read_threads=4, epochs=5, format="npz")
_RESNET50 = dict(files=1024, samples_per_file=1251, record_length=114_660, record_stdev=0,
                 read_threads=8, epochs=5, format="tfrecord")
_COSMOFLOW = dict(files=524_288, samples_per_file=1, record_length=2_828_486,
                  record_stdev=71_311, read_threads=4, batch=1, epochs=5, format="tfrecord")
_DLIO = "DLIO configs/workload/{}.yaml (MLPerf Storage v1.0/v2.0)"
_RETINANET = dict(files=1_743_042, samples_per_file=1, record_length=153_600,
                  record_stdev=51_200, read_threads=8, format="jpeg")
_RETINANET_B200 = dict(files=1_170_301, samples_per_file=1, record_length=322_957,
                       record_stdev=0, read_threads=8, epochs=8, format="jpeg")
_FLUX = dict(files=1_099_776, samples_per_file=1, record_length=307_200, record_stdev=102_400,
             batch=8, read_threads=8, epochs=5, format="jpeg")
_FLUX_PARQUET = dict(files=4296, samples_per_file=288, record_length=2_164_832, record_stdev=0,
                     read_threads=8, epochs=1, format="parquet")
_DLRM = dict(files=65_536, samples_per_file=1, record_length=512, record_stdev=0, batch=8192,
             read_threads=8, epochs=1, format="npz")
_V3 = "mlcommons/storage configs/dlio/workload/{}.yaml at {} (MLPerf Storage v3.0)"

WORKLOADS = {w.name: w for w in (
    Workload("unet3d-h100", **_UNET3D, batch=7, computation_time=0.323, au_floor=0.90,
             source=_DLIO.format("unet3d_h100")),
    Workload("unet3d-a100", **_UNET3D, batch=7, computation_time=0.636, au_floor=0.90,
             source=_DLIO.format("unet3d_a100")),
    Workload("unet3d-v100", **_UNET3D, batch=4, computation_time=1.3604, au_floor=None,
             source=_DLIO.format("unet3d_v100")),
    Workload("resnet50-h100", **_RESNET50, batch=400, computation_time=0.224, au_floor=0.90,
             source=_DLIO.format("resnet50_h100")),
    Workload("resnet50-a100", **_RESNET50, batch=400, computation_time=0.435, au_floor=0.90,
             source=_DLIO.format("resnet50_a100")),
    Workload("cosmoflow-h100", **_COSMOFLOW, computation_time=0.00350, au_floor=0.70,
             source=_DLIO.format("cosmoflow_h100")),
    Workload("cosmoflow-a100", **_COSMOFLOW, computation_time=0.00551, au_floor=0.70,
             source=_DLIO.format("cosmoflow_a100")),
    # MLPerf Storage v3.0 (mlcommons/storage, in development: each figure is the YAML's at the
    # commit named; a newer commit may change it). One sample a file unless said.
    Workload("retinanet-a100", **_RETINANET, batch=16, computation_time=0.210, epochs=5,
             au_floor=0.85, source=_V3.format("retinanet_a100", "c8d70b66")),
    Workload("retinanet-h100", **_RETINANET, batch=16, computation_time=0.180, epochs=5,
             au_floor=0.85, source=_V3.format("retinanet_h100", "fa240126")),
    Workload("retinanet-b200", **_RETINANET_B200, batch=24, computation_time=0.04755,
             au_floor=0.85, source=_V3.format("retinanet_b200", "11460d00")),
    Workload("retinanet-mi355", **_RETINANET_B200, batch=32, computation_time=0.0634,
             au_floor=0.85, source=_V3.format("retinanet_mi355", "76f45459")),
    Workload("flux-a100", **_FLUX, computation_time=1.100, au_floor=0.80,
             source=_V3.format("flux_a100", "bdc54624")),
    Workload("flux-h100", **_FLUX, computation_time=0.850, au_floor=0.80,
             source=_V3.format("flux_h100", "7e73663b")),
    # b200 and mi355: parquet files of 288 samples of 2,164,832 B (t5 and clip encodings, mean,
    # logvar, timestamp), every column read
    Workload("flux-b200", **_FLUX_PARQUET, batch=48, computation_time=1.35, au_floor=0.90,
             source=_V3.format("flux_b200", "c25079c2")),
    Workload("flux-mi355", **_FLUX_PARQUET, batch=72, computation_time=2.025, au_floor=0.90,
             source=_V3.format("flux_mi355", "0b42eb50")),
    Workload("dlrm-a100", **_DLRM, computation_time=0.007, au_floor=0.70,
             source=_V3.format("dlrm_a100", "a65ba8c3")),
    Workload("dlrm-h100", **_DLRM, computation_time=0.005, au_floor=0.70,
             source=_V3.format("dlrm_h100", "a65ba8c3")),
    # the parquet variant as published for a100 and h100: the same samples in parquet files
    Workload("dlrm-parquet-a100", **{**_DLRM, "format": "parquet"}, computation_time=0.007,
             au_floor=0.70, source=_V3.format("dlrm_parquet_a100", "2707667c")),
    Workload("dlrm-parquet-h100", **{**_DLRM, "format": "parquet"}, computation_time=0.005,
             au_floor=0.70, source=_V3.format("dlrm_parquet_h100", "2707667c")),
    # seed 001: 20,480 files (~3 TB), 32 samples per accelerator load at V100's 1.3604 s: a
    # demand of 3.45 GB/s per accelerator, the seed's "theoretical ceiling 3,400 MB/s"
    Workload("unet3d-seed001", **{**_UNET3D, "files": 20_480}, batch=32, computation_time=1.3604,
             au_floor=0.90, source="seed 001 (DLIO UNet3D, V100 compute, 32 samples per load)"),
)}

STEPS_PER_EPOCH = 500  # MLPerf Storage mlpstorage/config.py
MEMORY_MULTIPLIER = 5  # MOST_MEMORY_MULTIPLIER: the dataset is at least 5x the hosts' RAM


def steps_per_epoch(w: Workload, accelerators: int) -> int:
    """DLIO main.py: floor(samples_per_file x files / batch / accelerators)."""
    return w.samples_per_file * w.files // w.batch // accelerators


def minimum_files(w: Workload, accelerators: int, host_memory: int) -> int:
    """MLPerf Storage's minimum dataset (rules §3 v1.0, §7 v2.0): samples for 500 steps of
    every accelerator, and at least 5x the host memory; in files."""
    samples = max(STEPS_PER_EPOCH * w.batch * accelerators,
                  math.ceil(MEMORY_MULTIPLIER * host_memory / w.record_length))
    return math.ceil(samples / w.samples_per_file)
