"""A vector-database run on DiskANN itself (the engine under Milvus's DISKANN index): seeded
clustered vectors written to a folder of qual's on the target; DiskANN's disk index built from
them there (timed, made durable, the drive's writes counted); the page cache's copy of it
dropped; then, for each search list, every query searched by `searchers` processes at once,
each query timed, the neighbours checked against an exact search of a sample, and the bytes
the searches read proven by the drive's own counters. Memory and room are checked before the
first byte is written."""

from __future__ import annotations

import errno
import json
import os
import selectors
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from qual import honesty, units, watchdog
from qual.engine import LatencyHistogram
from qual.errors import InvalidJob, QualError, TargetUnavailable
from qual.family import Repetition, host_memory
from qual.targets import Target
from qual.targets.scratch import drop_cache, fsync_dir, own_folder, remove_made
from qual.workloads.vectordb import data
from qual.workloads.vectordb.spec import (data_bytes, index_bytes, memory, pq_budget_gb,
                                          pq_chunks, space)

FOLDER = "qual-vectordb"
MANIFEST = "manifest.json"
BUILT = "built.json"  # in a run's folder once its index is built and durable
WORKER = "qual.workloads.vectordb.worker"


def check_fits(target: Target, table: dict) -> None:
    """Refuse, before any I/O, a run whose build or searchers need more memory than the host
    has, or whose files need more room than the target's folder has: both figures said."""
    need, have = memory(table), host_memory()
    if have is not None and need > have:
        raise InvalidJob(errno.ENOMEM, f"the index of {table['vectors']:,} x "
                         f"{table['dimensions']} vectors needs {units.format_size(need)} of "
                         f"host memory (the build, or {table['searchers']} searchers' PQ code), "
                         f"and this host has {units.format_size(have)} available: lower "
                         "vectors, searchers or build_memory", target=target.spec)
    folder = target.directory
    room = shutil.disk_usage(folder).free if folder is not None else None
    if room is not None and space(table) > room:
        raise InvalidJob(errno.ENOSPC, f"the vectors and the disk index need "
                         f"{units.format_size(space(table))} on the target, and "
                         f"{folder} has {units.format_size(room)} free: lower vectors "
                         "(--qual-fit scales them to fit)", target=target.spec)


def run(target: Target, table: dict, *, progress=None,
        repetition: Repetition = Repetition()) -> dict:
    """The whole run in a folder of its own on the target, removed afterwards. A repeated
    run builds the index in its first repetition and searches it in every one, as MLPerf
    Storage's vector database loads its collection once and searches it five times: the
    folder stays for the next repetition, and goes after the last or when a run fails."""
    if target.directory is None:
        raise TargetUnavailable(errno.ENOTSUP, "a vector index needs a filesystem: give a "
                                "directory on the drive, or a raw namespace (qual makes one)",
                                target=target.spec)
    check_fits(target, table)
    folder = own_folder(target.directory / FOLDER) / f"run-{os.getpid()}"
    build = repetition.first or not (folder / BUILT).exists()
    if build:
        folder.mkdir()
        (folder / MANIFEST).write_text(json.dumps({"created_by": "qual"}))
    ended = False
    try:
        result = _run(target, table, folder, progress or (lambda *a, **k: None), build=build)
        ended = True
        return result
    finally:
        if repetition.last or not ended:  # the run's own folder: made above, by it
            shutil.rmtree(folder, ignore_errors=True)


def _run(target: Target, table: dict, folder: Path, say, *, build: bool) -> dict:
    """The vectors written, the index built and the sample's exact neighbours found (unless
    `build` is false: an earlier repetition did all three in `folder`), then every search list
    searched. The searches read the index by O_DIRECT: each repetition's come from the drive."""
    n, d = table["vectors"], table["dimensions"]
    lists = table["search_lists"]
    steps = 2 + len(lists)  # vectors, build, then one per search list
    index, truth_path = folder / "index", folder / "truth.npy"
    built = None
    if build:
        say(f"vectordb: writing {n:,} vectors of {d} dimensions", 0.0)
        vectors_path = folder / "vectors.bin"
        data.write_vectors(vectors_path, table)
        queries = data.queries(table)
        np.save(folder / "queries.npy", queries)
        index.mkdir()
        say(f"vectordb: building the disk index (degree {table['graph_degree']}, build list "
            f"{table['build_list']}, {pq_chunks(table)} B of PQ code a vector)", 1 / steps)
        built = _build(target, table, folder, vectors_path, index)
        np.save(truth_path, data.exact_neighbours(data.read_vectors(vectors_path),
                                                  queries[:table["recall_queries"]], table["k"]))
        drop_cache(vectors_path)
        (folder / BUILT).write_text(json.dumps({"seconds": built["seconds"]}))
    else:
        say("vectordb: searching the index this run's first repetition built", 2 / steps)
    truth = np.load(truth_path)
    searches = []
    with Searchers(table, folder, index) as searchers:
        for i, L in enumerate(lists):
            say(f"vectordb: search list {L}: {table['queries']:,} queries, "
                f"{table['searchers']} in flight", (2 + i) / steps)
            searches.append(_search(target, table, searchers, L, truth))
    return {"vectors": n, "dimensions": d, "k": table["k"], "searchers": table["searchers"],
            "beam_width": table["beam_width"], "queries": table["queries"],
            "recall_queries": table["recall_queries"], "pq_chunks": pq_chunks(table),
            "graph_degree": table["graph_degree"], "build": built, "searches": searches,
            "target": str(folder), "diskannpy": _version()}


def _version() -> str:
    from importlib.metadata import version
    return version("diskannpy")


def _build(target: Target, table: dict, folder: Path, vectors: Path, index: Path) -> dict:
    """DiskANN's build in a process of its own, timed to the index's files made durable;
    the drive's writes counted around it; then the page cache's copy of the index dropped."""
    job = {"kind": "build", "data": str(vectors), "index": str(index),
           "build_list": table["build_list"], "graph_degree": table["graph_degree"],
           "pq_budget_gb": pq_budget_gb(table), "build_memory": table["build_memory"],
           "threads": table["build_threads"] or os.cpu_count() or 1}
    path = folder / "build.json"
    path.write_text(json.dumps(job))
    before = target.device_stat()
    started = time.monotonic()
    with open(folder / "build.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", WORKER, str(path)], stdout=log,
                                stderr=log, stdin=subprocess.DEVNULL,
                                preexec_fn=watchdog.dies_with_me())
    try:
        status = proc.wait(timeout=table["timeout"])
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise QualError(errno.ETIMEDOUT, f"the index build did not end within "
                        f"{units.format_duration(table['timeout'])}", target=target.spec) from None
    if status:
        raise QualError(errno.EIO, f"DiskANN's build exited with {status}: "
                        f"{_tail(folder / 'build.log')}", target=target.spec)
    files = sorted(p for p in index.iterdir() if p.is_file())
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(index)
    seconds = time.monotonic() - started
    seen = honesty.between(before, target.device_stat())
    size = sum(p.stat().st_size for p in files)
    truth = honesty.check_device(seen, "write_bytes", size, "the disk index's files",
                                 target.spec)
    for p in files:
        drop_cache(p)
    disk = index / "ann_disk.index"
    if disk.stat().st_size != index_bytes(table):
        raise QualError(errno.EIO, f"DiskANN's disk index is {disk.stat().st_size:,} B, not the "
                        f"{index_bytes(table):,} B its layout takes: the plan's arithmetic "
                        "does not hold for this DiskANN", target=target.spec)
    return {"seconds": seconds, "index_bytes": size, "disk_index_bytes": disk.stat().st_size,
            "device": seen, "written": seen["write_bytes"] if seen else None, "truth": truth,
            "vectors_bytes": data_bytes(table)}


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-1500:]
    except OSError:
        return "(no log)"


class Searchers:
    """`searchers` processes, each with the index open and one query in flight at a time;
    `search(L)` runs every query at search list L across them and returns each one's file.
    Every wait is bounded by the table's timeout; they die with this process."""

    def __init__(self, table: dict, folder: Path, index: Path):
        self.table, self.folder = table, folder
        self.procs: list[subprocess.Popen] = []
        self.controls: list[int] = []
        self.selector = selectors.DefaultSelector()

    def __enter__(self) -> "Searchers":
        t = self.table
        for s in range(t["searchers"]):
            r, w = os.pipe()
            job = {"kind": "search", "index": str(self.folder / "index"),
                   "queries": str(self.folder / "queries.npy"), "searcher": s,
                   "searchers": t["searchers"], "k": t["k"], "beam_width": t["beam_width"],
                   "cache_nodes": t["cache_nodes"], "dimensions": t["dimensions"],
                   "out": str(self.folder / f"searcher-{s}"), "control": w}
            path = self.folder / f"searcher-{s}.json"
            path.write_text(json.dumps(job))
            with open(self.folder / f"searcher-{s}.log", "wb") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", WORKER, str(path)], stdin=subprocess.PIPE,
                    stdout=log, stderr=log, pass_fds=(w,), text=True,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                    preexec_fn=watchdog.dies_with_me()))
            os.close(w)
            self.controls.append(r)
            self.selector.register(r, selectors.EVENT_READ, s)
        self._await("ready")
        return self

    def _await(self, word: str) -> None:
        """Wait until every searcher has said `word`, at most the table's timeout."""
        deadline = time.monotonic() + self.table["timeout"]
        waiting = set(range(len(self.procs)))
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise QualError(errno.ETIMEDOUT, f"{len(waiting)} searchers did not say "
                                f"{word!r} within {units.format_duration(self.table['timeout'])}")
            for key, _ in self.selector.select(timeout=min(left, 1.0)):
                s = key.data
                said = os.read(key.fd, 4096).decode()
                if not said:  # the searcher ended without saying it
                    status = self.procs[s].wait(timeout=5)
                    raise QualError(errno.EIO, f"searcher {s} exited with {status}: "
                                    f"{_tail(self.folder / f'searcher-{s}.log')}")
                if word in said:
                    waiting.discard(s)

    def search(self, L: int) -> tuple[float, list[Path]]:
        """Every query at search list L, all searchers at once: the wall time from the first
        query handed out to the last answer, and each searcher's result file."""
        started = time.monotonic()
        for p in self.procs:
            p.stdin.write(f"{L}\n")
            p.stdin.flush()
        self._await(f"done {L}")
        return time.monotonic() - started, [self.folder / f"searcher-{s}-L{L}.npz"
                                            for s in range(len(self.procs))]

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for r in self.controls:
            self.selector.unregister(r)
            os.close(r)
        self.selector.close()


def _search(target: Target, table: dict, searchers: Searchers, L: int,
            truth: np.ndarray) -> dict:
    """One search list's sweep: QPS, each query's latency, recall on the sample, and the
    bytes the searchers read against what the drive counted (device truth), with their
    page-ins: pages of their code read back meanwhile, counted among their bytes though they
    may come from another device."""
    before = target.device_stat()
    wall, files = searchers.search(L)
    seen = honesty.between(before, target.device_stat())
    ids = np.empty((table["queries"], table["k"]), dtype=np.int64)
    latency, read, page_ins = [], 0, 0
    for f in files:
        with np.load(f) as part:
            ids[part["queries"]] = part["ids"]
            latency.append(part["latency_ns"])
            read += int(part["read"])
            page_ins += int(part["page_ins"])
    ns = np.concatenate(latency)
    lat = ns / 1e9
    where = f"DiskANN's sector reads at search list {L}"
    truth_said = honesty.check_device(seen, "read_bytes", read, where, target.spec) \
        if read else {"device_truth": honesty.NO_DEVICE}
    return {"search_list": L, "wall_s": wall, "qps": table["queries"] / wall,
            "latency_s": {"mean": float(lat.mean()),
                          **{str(p): float(np.percentile(lat, p)) for p in (50, 95, 99, 99.9)}},
            "latency_bins": LatencyHistogram.from_samples(ns.tolist()).to_bins(),
            "recall": data.recall(ids[:len(truth)], truth), "read_bytes": read,
            "page_ins": page_ins,
            "device_read_bytes": seen["read_bytes"] if seen else None,
            "read_per_query": read / table["queries"], "truth": truth_said}


def remove(target: Target) -> None:
    if target.directory is not None:
        remove_made(target.directory / FOLDER, MANIFEST)
