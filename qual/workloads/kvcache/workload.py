"""A KV-cache run: users in QoS classes hold conversations with an inference server that keeps
each turn's attention keys and values (one KV entry) in its fastest tier with room — host
memory (`cpu_mem`, LRU), then the drive (a store qual lays out on the target) — evicting the
least recently used entries down a tier ("waterfall"). The server serves every request that
has arrived as one batch, as continuous batching does: prefill writes the batch's new entries,
decode reads back every entry of each conversation that host memory does not hold. Entries
move through the native engine with O_DIRECT (qual.engine.KvStore), so the drive's own
counters account for every byte."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from qual import engine, honesty
from qual.errors import InvalidJob, TargetUnavailable
from qual.target import Target
from qual.target.scratch import fsync_dir, own_folder, remove_made
from qual.workloads.kvcache.spec import MODELS, QOS, drive_bytes, entry_bytes

FOLDER = "qual-kvcache"
MANIFEST = "manifest.json"


@dataclass
class Request:
    user: int
    turn: int
    qos: str
    arrival: float
    new_tokens: int
    started: float = 0.0
    done: float = 0.0
    write_s: float | None = None   # its entries' storage time on the drive (None: none there)
    read_s: float | None = None


@dataclass
class Tiers:
    """Where each entry is: host memory (LRU, `cpu_mem` bytes) or the drive (its offset)."""

    cpu_mem: int
    cpu: OrderedDict = field(default_factory=OrderedDict)  # key -> bytes
    cpu_used: int = 0
    drive: dict = field(default_factory=dict)  # key -> (offset, bytes)
    next_offset: int = 0
    store_size: int = 0

    def place(self, key, size: int) -> list:
        """A new entry: into host memory when it fits there (evicting the least recently used
        entries, which then go to the drive), else to the drive. Returns the (key, bytes) the
        drive must take now."""
        to_drive = []
        if size > self.cpu_mem:
            return [(key, size)]
        while self.cpu_used + size > self.cpu_mem:
            old, old_size = self.cpu.popitem(last=False)
            self.cpu_used -= old_size
            to_drive.append((old, old_size))
        self.cpu[key] = size
        self.cpu_used += size
        return to_drive

    def offset_for(self, key, size: int) -> int:
        if self.next_offset + size > self.store_size:
            raise InvalidJob(28, f"the store's {self.store_size} bytes cannot hold another "
                             f"{size}-byte entry: raise store_size, or lower users, requests "
                             "or context_tokens")
        self.drive[key] = (self.next_offset, size)
        self.next_offset += size
        return self.drive[key][0]


def _requests(table: dict, rng: np.random.Generator) -> list[list[Request]]:
    lo, hi = table["context_tokens"]
    classes = table["classes"]
    out = []
    for u in range(table["users"]):
        first = int(rng.integers(lo, hi + 1))
        out.append([Request(u, t, classes[u % len(classes)], 0.0,
                            first if t == 0 else table["turn_tokens"] + table["generation_tokens"])
                    for t in range(table["requests"])])
    return out


def run(target: Target, table: dict, *, seed: int = 1, progress=None) -> dict:
    """Every user's conversation, batch by batch; returns the run's result document."""
    if table["gpu_mem"]:
        raise TargetUnavailable(19, "a GPU tier needs CUDA, and this host has none: gpu_mem "
                                "must be 0", target=target.spec)
    if target.directory is None:
        raise TargetUnavailable(95, "the KV store is laid out in a directory (a block-device "
                                "store is not built yet)", target=target.spec)
    model = MODELS[table["model"]]
    rng = np.random.default_rng(seed)
    convs = _requests(table, rng)
    folder = own_folder(target.directory / FOLDER) / f"run-{os.getpid()}"
    folder.mkdir()
    (folder / MANIFEST).write_text(json.dumps({"created_by": "qual"}))
    try:
        return _serve(target, table, folder, convs, model, seed, progress)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the run's own store: made above, by it


def _serve(target: Target, table: dict, folder, convs, model, seed: int, progress) -> dict:
    bpt = model.bytes_per_token
    store = folder / "store.bin"
    size = table["store_size"] or drive_bytes(table)
    with open(store, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)
    fsync_dir(folder)
    tiers = Tiers(table["cpu_mem"], store_size=size)
    biggest = max(r.new_tokens for c in convs for r in c)
    pool = engine.aligned_empty(entry_bytes(biggest, bpt))
    engine.fill_random(pool, seed)
    sink = engine.aligned_empty(len(pool))
    device_before = target.device_stat()
    written = read = 0
    storage_s = 0.0
    hits = {"cpu": 0, "drive": 0}
    next_turn = [0] * len(convs)
    ready_at = [0.0] * len(convs)
    served: list[Request] = []
    t0 = time.monotonic()
    with engine.KvStore(str(store), block_size=table["block_size"],
                        queue_depth=table["queue_depth"], backend=table["backend"]) as kv:
        while any(t < len(c) for t, c in zip(next_turn, convs)):
            now = time.monotonic() - t0
            waiting = [u for u, t in enumerate(next_turn) if t < len(convs[u])]
            first = min(ready_at[u] for u in waiting)
            if first > now:
                time.sleep(first - now)
                now = time.monotonic() - t0
            batch = [convs[u][next_turn[u]] for u in waiting if ready_at[u] <= now]
            for r in batch:
                r.arrival, r.started = ready_at[r.user], now
            # prefill: each request's new entry, placed in the fastest tier with room
            writes, owner = [], []
            for r in batch:
                size = entry_bytes(r.new_tokens, bpt)
                for key, nbytes in tiers.place((r.user, r.turn), size):
                    writes.append((tiers.offset_for(key, nbytes), pool[:nbytes]))
                    owner.append(r)
            if writes:
                w = kv.write(writes)
                written += w.bytes
                storage_s += w.elapsed
                for r, lat in zip(owner, w.latencies):
                    r.write_s = max(r.write_s or 0.0, float(lat) + w.sync_s)
            # decode: every entry of the conversation so far that host memory does not hold
            reads, owner = [], []
            for r in batch:
                for turn in range(r.turn + 1):
                    key = (r.user, turn)
                    if key in tiers.cpu:
                        tiers.cpu.move_to_end(key)
                        hits["cpu"] += 1
                    else:
                        offset, nbytes = tiers.drive[key]
                        reads.append((offset, sink[:nbytes]))
                        owner.append(r)
                        hits["drive"] += 1
            if reads:
                got = kv.read(reads)
                read += got.bytes
                storage_s += got.elapsed
                for r, lat in zip(owner, got.latencies):
                    r.read_s = max(r.read_s or 0.0, float(lat))
            end = time.monotonic() - t0
            for r in batch:
                r.done = end
                next_turn[r.user] += 1
                ready_at[r.user] = end + table["think_time"]
                served.append(r)
            if progress:
                done = sum(next_turn) / sum(len(c) for c in convs)
                progress(f"{len(served)} requests served", done)
        backend = kv.backend
    wall = time.monotonic() - t0
    seen = honesty.between(device_before, target.device_stat())
    return {"model": model.name, "bytes_per_token": bpt, "backend": backend, "wall_s": wall,
            "storage_s": storage_s, "written": written, "read": read, "hits": hits,
            "tokens": table["generation_tokens"] * len(served),
            "requests": [r.__dict__ for r in served], "store": str(store),
            "qos": {c: QOS[c] for c in table["classes"]},
            "device": seen,
            "write_truth": honesty.check_device(seen, "write_bytes", written, "KV entries "
                                                "written", str(store)) if written else {},
            "read_truth": honesty.check_device(seen, "read_bytes", read, "KV entries read "
                                               "back", str(store)) if read else {}}


def remove(target: Target) -> None:
    if target.directory is not None:
        remove_made(target.directory / FOLDER, MANIFEST)
