"""DLIO's training workloads as published (dlio_benchmark/configs/workload/*.yaml, the same in
MLPerf Storage v1.0 and v2.0), MLPerf Storage v3.0's new ones (mlcommons/storage
configs/dlio/workload/*.yaml: RetinaNet, Flux, DLRM), seed 001's UNet3D variant, and MLPerf
Storage's dataset-size rule (docs/ARCHITECTURE.md §9: DLIO, MLPerf Storage v2.0 and v3.0,
seed 001)."""

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
    columns: str = ""         # a columnar file's columns, one dtype code each (COLUMN_BYTES)
    read_columns: tuple[int, ...] = ()  # the columns a loader reads (parquet `read: true`)
    row_group: int = 0        # rows per row group (parquet row_group_size)

    @property
    def file_bytes(self) -> int:
        return self.samples_per_file * self.record_length

    @property
    def sample_read_bytes(self) -> int:
        """Bytes of a sample the loader reads: all of it, or its read columns' bytes."""
        if not self.read_columns:
            return self.record_length
        return sum(COLUMN_BYTES[self.columns[c]] for c in self.read_columns)

    def demand(self) -> float:
        """Bytes per second one accelerator consumes at 100 % AU."""
        return self.batch * self.sample_read_bytes / self.computation_time \
            if self.computation_time else math.inf

    def column_ranges(self) -> list[tuple[int, int]]:
        """A columnar file's (offset, bytes) of every read column's chunk in every row group:
        row groups of `row_group` rows one after another, each holding its columns' chunks in
        order (a chunk is rows x the column's dtype). Empty for a file read whole."""
        if not self.read_columns:
            return []
        sizes = [COLUMN_BYTES[c] for c in self.columns]
        before = [sum(sizes[:c]) for c in range(len(sizes))]
        out, at = [], 0
        for first in range(0, self.samples_per_file, self.row_group):
            rows = min(self.row_group, self.samples_per_file - first)
            out += [(at + rows * before[c], rows * sizes[c]) for c in self.read_columns]
            at += rows * self.record_length
        return out

    def scaled(self, *, files: int | None = None, record_scale: float = 1.0, **kw) -> Workload:
        """A smaller (or changed) copy for small targets: record length and its spread scale
        together (a columnar file's rows instead: its columns are its dtypes); the sample count
        per file, threads and compute stay as published."""
        if self.read_columns:
            rows = max(1, round(self.samples_per_file * record_scale))
            return replace(self, files=files or self.files, samples_per_file=rows,
                           row_group=min(self.row_group, rows),
                           **{k: v for k, v in kw.items() if v is not None})
        return replace(self, files=files or self.files,
                       record_length=max(1, round(self.record_length * record_scale)),
                       record_stdev=round(self.record_stdev * record_scale),
                       **{k: v for k, v in kw.items() if v is not None})


COLUMN_BYTES = {"b": 1, "h": 2, "f": 4, "d": 8}  # int8, float16, float32, float64


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
# DLRM b200/mi355: parquet files of 4,718,592 rows of 761 B in row groups of 6,144, 200 columns
# (feature_000..199, dtypes below: 761 B in all), of which the loader reads 40 (160 B a row)
_DLRM_PARQUET = dict(
    files=1024, samples_per_file=4_718_592, record_length=761, record_stdev=0, batch=16384,
    read_threads=4, epochs=1, format="parquet", row_group=6144,
    columns="hhddfhfbhbffdfbhfffhddddhffhhfdfdfhhdbbbhfhfdbdddffbbfffbfhfdhdbfhbfhfhfhffdhbfd"
            "bbffhbhbfbffhfddfhbhhdhfdhhfdfddbhhbbdfbhhbbbhbbfbhfdhhdhfddhfbbdfdfddbbbddffbfh"
            "fhfhdhdhfbdhbdbbbbhhbdddhdbbhfdbdfdffddh",
    read_columns=(11, 17, 18, 20, 25, 31, 41, 43, 49, 53, 58, 59, 67, 68, 71, 74, 75, 88, 90,
                  91, 92, 93, 94, 96, 97, 116, 117, 137, 141, 147, 154, 155, 158, 160, 162,
                  169, 180, 186, 189, 195))

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
    # b200 and mi355: one parquet layout (_DLRM_PARQUET), column-selective row-group reads
    Workload("dlrm-b200", **_DLRM_PARQUET, computation_time=0.000375, au_floor=0.70,
             source=_V3.format("dlrm_b200", "0b42eb50")),
    Workload("dlrm-mi355", **_DLRM_PARQUET, computation_time=0.0005625, au_floor=0.70,
             source=_V3.format("dlrm_mi355", "11460d00")),
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
