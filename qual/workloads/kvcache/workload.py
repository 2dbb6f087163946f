"""A KV-cache run: users in QoS classes hold conversations (after a shared prefix, where
there are some) with an inference server that keeps each turn's attention keys and values
(one KV entry) in its fastest tier with room — GPU memory where CUDA exists (`gpu_mem`), host
memory (`cpu_mem`), each least recently used first out, then the drive (a store qual lays out
on the target: a file in a folder of its own, or a block device's first bytes past the
guard) — evicting down a tier ("waterfall"). The server serves the requests that have arrived
together, as continuous batching does, but the highest QoS class that has arrived first, as
the reference's priority queue does: prefill writes that class's new entries, decode reads
back every entry of each conversation that memory does not hold; then the next. Entries move through
the native engine with O_DIRECT (qual.engine.KvStore), so the drive's own counters account
for every byte. A run is one user count (fixed) or a search over them (qos, capacity)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from qual import engine, honesty
from qual.errors import Refused, TargetUnavailable
from qual.targets import Target
from qual.targets.scratch import fsync_dir, own_folder, remove_made
from qual.units import format_size
from qual.workloads.kvcache.spec import (ALIGN, FREE_SHARE, MODELS, QOS, conversation_bytes,
                                         drive_bytes, entry_bytes, largest_entry, prefix_bytes,
                                         targets, turn_entries)
from qual.workloads.kvcache import draw
from qual.workloads.kvcache.tally import Tally

FOLDER = "qual-kvcache"
POOL = 64 << 20  # the most memory an entry moves from or into: a longer one repeats it
PRIORITY = tuple(QOS)  # the reference's service order: interactive, responsive, batch
MANIFEST = "manifest.json"


@dataclass
class Request:
    user: int
    conversation: int  # the user's how-manyth conversation (a duration-bound run starts more)
    turn: int
    qos: str
    new_tokens: int
    generated: int = 0      # tokens it generates
    decode_reads: int = 1   # times decode reads its new entry (0: prefilled only)
    pause: float = 0.0      # its user's think time before it
    arrival: float = 0.0
    started: float = 0.0
    done: float = 0.0
    write_s: float | None = None   # its entries' storage time on the drive (None: none there)
    read_s: float | None = None


@dataclass
class Tiers:
    """Where each entry is: in a memory tier, fastest first (the GPU's, then host memory's),
    each least recently used first out, its evicted entries cascading to the next tier
    ("waterfall"), or on the drive. A memory tier is its capacity: what it holds never reaches
    the drive, and the drive's traffic is what is measured. The store holds the shared
    prefixes' entries first, then one region per user one conversation long, each turn's entry
    at its place in it: a conversation that ends gives its region to the user's next one."""

    memory: list[tuple[str, int]]  # (tier, bytes), fastest first
    region: int          # bytes of one user's region
    first: int           # bytes of a first turn's entry, at most
    later: int           # bytes of each later turn's
    prefix: int = 0      # bytes of a shared prefix's entry
    prefixes: int = 0
    ring: int = 0        # >0: the store is a ring of this many bytes (the reference draw)
    held: dict = field(default_factory=dict)   # tier -> OrderedDict of key -> bytes
    used: dict = field(default_factory=dict)   # tier -> bytes held
    drive: dict = field(default_factory=dict)  # key -> (offset, bytes)

    head: int = 0        # the ring's next free byte

    def __post_init__(self):
        self.held = {tier: OrderedDict() for tier, _ in self.memory}
        self.used = dict.fromkeys(self.held, 0)

    def place(self, key, size: int, tier: int = 0) -> list:
        """A new entry: into the fastest memory tier that can hold it (from `tier` on), its
        least recently used entries cascading down a tier to make room. Returns the (key,
        bytes) the drive must take now."""
        if tier == len(self.memory):
            return [(key, size)]
        name, capacity = self.memory[tier]
        if size > capacity:
            return self.place(key, size, tier + 1)
        held, down = self.held[name], []
        while self.used[name] + size > capacity:
            old, old_size = held.popitem(last=False)
            self.used[name] -= old_size
            down += self.place(old, old_size, tier + 1)
        held[key] = size
        self.used[name] += size
        return down

    def where(self, key) -> str | None:
        """The tier that holds the entry (None: the ring overwrote it); a memory tier's hit
        makes it its most recent."""
        for name, held in self.held.items():
            if key in held:
                held.move_to_end(key)
                return name
        return "drive" if key in self.drive else None

    def has(self, key) -> bool:
        return key in self.drive or any(key in held for held in self.held.values())

    def offset_for(self, key, size: int) -> int:
        if self.ring:
            return self._ring_offset(key, size)
        if key[0] == "prefix":
            offset = key[1] * self.prefix
        else:
            user, _, turn = key
            offset = self.prefixes * self.prefix + user * self.region + \
                (self.first + (turn - 1) * self.later if turn else 0)
        self.drive[key] = (offset, size)
        return offset

    def _ring_offset(self, key, size: int) -> int:
        """The ring: entries laid one after another, from the start again where the next
        would pass the end; the entries it overlaps leave the drive (oldest written first,
        where the reference evicts the least recently used)."""
        if self.head + size > self.ring:
            self.head = 0
        start, end = self.head, self.head + size
        for old in [k for k, (o, n) in self.drive.items() if o < end and o + n > start]:
            del self.drive[old]
        self.drive[key] = (start, size)
        self.head = end
        return start

    def forget(self, user: int, conversation: int, turns: int) -> None:
        """A conversation that ended: its entries leave every tier (its prefix stays)."""
        for turn in range(turns):
            key = (user, conversation, turn)
            self.drive.pop(key, None)
            for name, held in self.held.items():
                size = held.pop(key, None)
                if size is not None:
                    self.used[name] -= size


def _conversation(table: dict, seed: int, user: int, conversation: int) -> list[Request]:
    """One conversation's requests, the same for the same seed whatever else runs."""
    lo, hi = table["context_tokens"]
    rng = np.random.default_rng([seed, user, conversation])
    classes = table["classes"]
    first = int(rng.integers(lo, hi + 1))
    later = table["turn_tokens"] + table["generation_tokens"]
    return [Request(user, conversation, t, classes[user % len(classes)],
                    first if t == 0 else later, generated=table["generation_tokens"],
                    pause=table["think_time"]) for t in range(table["requests"])]


def _drawn(profile: draw.User, seed: int, user: int, conversation: int) -> list[Request]:
    """One conversation of the reference's draw (qual.workloads.kvcache.draw)."""
    return [Request(user, conversation, t, profile.qos, turn.tokens, generated=turn.generated,
                    decode_reads=turn.decode_reads, pause=turn.pause)
            for t, turn in enumerate(draw.conversation(profile, seed, user, conversation))]


def _cuda() -> bool:
    import torch  # only a run with a GPU tier pays for torch's import

    return torch.cuda.is_available()


def run(target: Target, table: dict, *, seed: int = 1, progress=None) -> dict:
    """The mode's runs: one of `users` users (fixed), or a search over user counts (qos,
    capacity); returns the chosen run's result document, with the search's trials."""
    if table["gpu_mem"] and not _cuda():
        raise TargetUnavailable(19, "a GPU tier needs CUDA, and this host has none: gpu_mem "
                                "must be 0", target=target.spec)
    table = settled(target, table, seed)
    if target.kind == "block":  # the store is the device's first bytes: the guard first
        most = table["max_users"] if table["mode"] != "fixed" else table["users"]
        target.ensure_writable(table["store_size"] or drive_bytes(table, most))
    runs: dict[int, dict] = {}

    def trial(users: int) -> dict:
        if progress and table["mode"] != "fixed":
            progress(f"{table['mode']} search: {users} users")
        runs[users] = _trial(target, {**table, "users": users}, seed, progress)
        return runs[users]

    if table["mode"] == "fixed":
        return {**trial(table["users"]), "mode": "fixed"}
    if table["mode"] == "qos":
        held, failed = search_qos(lambda n: holds(trial(n), table), table["users"],
                                  table["search_step"], table["max_users"])
        chosen = {"max_users": held, "failed_at": failed}
        result = runs[held or failed]
    else:
        peak = search_capacity(lambda n: trial(n)["storage_tokens_per_s"], table["users"],
                               table["max_users"])
        chosen = {"peak_users": peak}
        result = runs[peak]
    trials = [{"users": n, "held": holds(r, table), "tokens_per_s": r["tokens_per_s"],
               "storage_tokens_per_s": r["storage_tokens_per_s"], "e2e": r["e2e"]}
              for n, r in sorted(runs.items())]
    return {**result, "mode": table["mode"], **chosen, "trials": trials}


def settled(target: Target, table: dict, seed: int) -> dict:
    """The table with the reference draw's store settled before any I/O: store_size 0 is
    FREE_SHARE of what the target offers (the room free beside a file target, a device's
    size), shared among the clients, as the reference takes 95 % of its folder's free room;
    refused where that cannot hold the draw's largest entry, and where it cannot hold one
    entry of every user at once (client c's users are seed + c's draw) unless accept_misses
    (then `store_short` says both figures, for the run's CAVEAT)."""
    if table["draw"] != "reference":
        return table
    size = table["store_size"] or \
        int(FREE_SHARE * target.capacity) // table["clients"] // ALIGN * ALIGN
    need = largest_entry(table)
    if size < need:
        raise TargetUnavailable(errno.ENOSPC, f"the reference draw's largest KV entry takes "
                                f"{format_size(need)}, and each of {table['clients']} "
                                f"client(s) has a store of {format_size(size)} (95 % of "
                                f"{format_size(target.capacity)} offered): give a larger "
                                "target, or lower the templates' context", target=target.spec)
    held = max(draw.held_at_once(table, seed + c) for c in range(table["clients"]))
    short = None
    if size < held:
        short = (f"the store of {format_size(size)} cannot hold what the {table['users']} users "
                 f"keep in flight at once ({format_size(held)}: each user's largest entry, as "
                 "the draw has them): the ring overwrites entries before decode reads them, and "
                 "the figures are of reads that did not happen")
        if not table["accept_misses"]:
            raise Refused(errno.ENOSPC, f"{short}. Give a target with more room (store_size), "
                          "fewer users or smaller templates' contexts, or --accept-misses to "
                          "run anyway with a CAVEAT", target=target.spec)
    return {**table, "store_size": size, "store_short": short}


def search_qos(held, start: int, step: int, most: int) -> tuple[int, int | None]:
    """(the most users whose run held, the users one step above it whose run did not) on the
    grid of `step`: from `start`, doubling while runs hold (up to `most`), then halving the gap
    between the last that held and the first that did not until it is one step. (0, start):
    not even the first held and none below it; (n, None): everything up to `most` held."""
    lo, hi = 0, None
    n = max(step, start - start % step)
    top = most - most % step
    while True:
        if not held(n):
            hi = n
            break
        lo = n
        if n >= top:
            return lo, None
        n = min(top, 2 * n)
    while hi - lo > step:
        mid = lo + (hi - lo) // (2 * step) * step
        if held(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


GROWTH = 1.05  # capacity: a doubling of users that adds less throughput than this is the top


def search_capacity(throughput, start: int, most: int) -> int:
    """The users at the peak storage throughput: from `start`, doubling (up to `most`) while
    each doubling raises the throughput by GROWTH at least."""
    best_n, best = start, throughput(start)
    n = start
    while n < most:
        n = min(most, 2 * n)
        got = throughput(n)
        if got > best:
            grew = got >= best * GROWTH
            best_n, best = n, got
            if grew:
                continue
        break
    return best_n


def holds(result: dict, table: dict) -> bool:
    """Whether every class's p95 and p99 end-to-end latency held its targets."""
    return all(result["e2e"][c][0] <= t95 and result["e2e"][c][1] <= t99
               for c, (t95, t99) in targets(table).items() if c in result["e2e"])


def _trial(target: Target, table: dict, seed: int, progress) -> dict:
    """One run of table["users"] users in a store of its own, removed afterwards; on a block
    device (past the guard) the store is the device's first bytes, and stays."""
    if target.kind == "block":
        return _serve(target, table, str(target.path), seed, progress)
    folder = own_folder(target.directory / FOLDER) / f"run-{os.getpid()}"
    folder.mkdir()
    (folder / MANIFEST).write_text(json.dumps({"created_by": "qual"}))
    try:
        store = folder / "store.bin"
        with open(store, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, table["store_size"] or drive_bytes(table))
        fsync_dir(folder)
        return _serve(target, table, str(store), seed, progress)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the run's own store: made above, by it


def _serve(target: Target, table: dict, store: str, seed: int, progress) -> dict:
    """One run through the engine's KV store at `store`, its bytes checked against the
    device's counters (device truth: a read the page cache served is an error)."""
    before = target.device_stat()
    with open_store(store, table) as kv:
        r = serve(table, kv, seed=seed, progress=progress)
    seen = honesty.between(before, target.device_stat())
    return {**r, "store": store, "store_bytes": table["store_size"] or drive_bytes(table),
            "device": seen,
            "write_truth": honesty.check_device(seen, "write_bytes", r["written"], "KV entries "
                                                "written", store) if r["written"] else {},
            "read_truth": honesty.check_device(seen, "read_bytes", r["read"], "KV entries read "
                                               "back", store) if r["read"] else {}}


def open_store(path: str, table: dict) -> engine.KvStore:
    """The engine's store for a run: O_DIRECT, its writes unique in every 4 KiB (a drive that
    compresses or deduplicates must still store every byte the run says it wrote)."""
    return engine.KvStore(path, block_size=table["block_size"], queue_depth=table["queue_depth"],
                          backend=table["backend"], unique=True)


def _prefix(r: Request, prefixes: int) -> tuple:
    """The shared prefix (system prompt) a user's conversations begin with."""
    return ("prefix", r.user % prefixes)


def serve(table: dict, kv, *, seed: int = 1, progress=None) -> dict:
    """The server's loop over a store `kv` (write(entries) and read(entries) of (offset,
    buffer) pairs, each returning bytes, elapsed, latencies, starts and sync_s; its backend): the
    engine's KvStore, or a peer a benchmark measures against it with the same requests."""
    model = MODELS[table["model"]]
    bpt = model.bytes_per_token
    users, duration = table["users"], table["duration"]
    first, later = turn_entries(table)
    prefix, prefixes = prefix_bytes(table), table["prefixes"]
    memory = ([("gpu", table["gpu_mem"])] if table["gpu_mem"] else []) + \
        [("cpu", table["cpu_mem"])]
    reference = table["draw"] == "reference"
    ring = table["store_size"] if reference else 0  # the run resolved it
    tiers = Tiers(memory, region=conversation_bytes(table), first=first, later=later,
                  prefix=prefix, prefixes=prefixes, ring=ring)
    largest = largest_entry(table) if reference else max(first, later, prefix)
    pool = engine.aligned_empty(largest if largest <= POOL else
                                max(1, POOL // table["block_size"]) * table["block_size"])
    engine.fill_random(pool, seed)
    sink = engine.aligned_empty(len(pool))
    if reference:
        profiles = [draw.profile(table, seed, u) for u in range(users)]
        talk = lambda u, c: _drawn(profiles[u], seed, u, c)  # noqa: E731
    else:
        talk = lambda u, c: _conversation(table, seed, u, c)  # noqa: E731
    convs = [talk(u, 0) for u in range(users)]
    next_turn = [0] * users
    # the reference's users pause before each request, the first too
    ready_at = [c[0].pause if reference else 0.0 for c in convs]
    written = read = tokens = misses = 0
    storage_s = request_io_s = 0.0
    hits = {**dict.fromkeys(tiers.held, 0), "drive": 0}
    tally = Tally(list(QOS) if reference else table["classes"], seed)
    total = users * table["requests"]  # a request-bound run's, for progress

    def span(offset: int, nbytes: int, buf) -> tuple:
        """An entry's (offset, buffer[, bytes]): a longer one than the buffer repeats it."""
        return (offset, buf[:nbytes]) if nbytes <= len(buf) else (offset, buf, nbytes)

    def decoded(r: Request) -> list:
        """The entries decode reads for a request. The reference draw: every earlier turn of
        its conversation once (those the ring still holds), then its own new entry
        decode_reads times; qual's: its prefix and its conversation so far, once each."""
        if reference:
            return [(r.user, r.conversation, t) for t in range(r.turn)] + \
                [(r.user, r.conversation, r.turn)] * r.decode_reads
        past = [(r.user, r.conversation, turn) for turn in range(r.turn + 1)]
        return ([_prefix(r, prefixes)] if prefixes else []) + past

    def moved(op: str, entries: list, owner: list[Request]) -> int:
        """One batch of entries through the store: its time counts as storage time; each
        request's span in it, from its first entry's first piece to its last entry's last
        (a write batch's fdatasync with it), adds to its write_s or read_s; each entry's own
        time (its fdatasync with it) is an entry latency. Returns the bytes moved."""
        nonlocal storage_s
        got = kv.write(entries) if op == "write" else kv.read(entries)
        storage_s += got.elapsed
        spans: dict[int, tuple[Request, float, float]] = {}
        for r, lat, start in zip(owner, got.latencies, got.starts):
            tally.entry(op, float(lat) + got.sync_s)
            _, first, last = spans.get(id(r), (r, float(start), 0.0))
            spans[id(r)] = (r, min(first, float(start)), max(last, float(start + lat)))
        for r, first, last in spans.values():
            setattr(r, f"{op}_s", (getattr(r, f"{op}_s") or 0.0) + last - first + got.sync_s)
        return got.bytes

    def serve_group(group: list[Request]) -> tuple[int, int]:
        """Prefill, then decode, of requests served together: the bytes written and read."""
        nonlocal misses
        # prefill: each request's new entry, placed in the fastest tier with room
        writes, owner = [], []
        for r in group:
            new = [((r.user, r.conversation, r.turn), entry_bytes(r.new_tokens, bpt))]
            if prefixes and not tiers.has(_prefix(r, prefixes)):  # its first user writes it
                new.insert(0, (_prefix(r, prefixes), prefix))
            for entry, size in new:
                for key, nbytes in tiers.place(entry, size):
                    writes.append(span(tiers.offset_for(key, nbytes), nbytes, pool))
                    owner.append(r)
        # at most `allocations` entries written at once (the reference's max-concurrent-allocs)
        step = table["allocations"] or len(writes) or 1
        w = sum(moved("write", writes[i:i + step], owner[i:i + step])
                for i in range(0, len(writes), step))
        # decode: what it reads that host memory does not hold
        reads, owner = [], []
        for r in group:
            for key in decoded(r):
                tier = tiers.where(key)
                if tier is None:  # the ring overwrote it: nothing to read
                    misses += 1
                    continue
                hits[tier] += 1
                if tier == "drive":
                    reads.append(span(*tiers.drive[key], sink))
                    owner.append(r)
        return w, moved("read", reads, owner) if reads else 0

    t0 = time.monotonic()
    pending: dict[int, Request] = {}  # arrived, not yet served, by user
    while True:
        now = time.monotonic() - t0
        waiting = [u for u in range(users) if next_turn[u] < len(convs[u])]
        if not waiting or (duration and now >= duration):
            break
        soonest = min(ready_at[u] for u in waiting)
        if not pending and soonest > now:
            time.sleep(soonest - now)
            now = time.monotonic() - t0
        for u in waiting:
            if u not in pending and ready_at[u] <= now:
                pending[u] = convs[u][next_turn[u]]
                pending[u].arrival = ready_at[u]
        # the reference's priority queue: of what has arrived, the highest class is served
        # next, all of its requests together (continuous batching); a lower class waits
        cls = next(c for c in PRIORITY if any(r.qos == c for r in pending.values()))
        group = [pending.pop(u) for u in [u for u, r in pending.items() if r.qos == cls]]
        begun = time.monotonic() - t0
        for r in group:
            r.started = begun
        w, rd = serve_group(group)
        written, read = written + w, read + rd
        end = time.monotonic() - t0
        for r in group:
            r.done = end
            next_turn[r.user] += 1
            tokens += r.generated
            request_io_s += (r.write_s or 0.0) + (r.read_s or 0.0)
            tally.add(r)
            if duration and next_turn[r.user] == len(convs[r.user]):
                # the conversation is over: the user's next one takes its room (the ring's
                # entries stay until it overwrites them, as the reference's until evicted)
                if not reference:
                    tiers.forget(r.user, r.conversation, len(convs[r.user]))
                convs[r.user] = talk(r.user, r.conversation + 1)
                next_turn[r.user] = 0
            if next_turn[r.user] < len(convs[r.user]):
                ready_at[r.user] = end + convs[r.user][next_turn[r.user]].pause
        if progress:
            done = min(1.0, end / duration) if duration else tally.served / total
            progress(f"{users} users: {tally.served} requests served", done)
    wall = time.monotonic() - t0
    wanted = misses + sum(hits.values())
    return {"model": model.name, "bytes_per_token": bpt, "backend": kv.backend, "users": users,
            "draw": table["draw"], "wall_s": wall, "storage_s": storage_s,
            "request_io_s": request_io_s, "written": written, "read": read, "hits": hits,
            "misses": misses, "overwritten_share": misses / wanted if wanted else 0.0,
            "tokens": tokens, **scored(tokens, wall, request_io_s, read, written),
            "drive_busy_tokens_per_s": tokens / storage_s if storage_s else 0.0,
            "served_by_class": {c: h.count for c, h in tally.e2e.items()},
            "store_short": table.get("store_short"),
            "e2e": tally.e2e_tail(), "served": tally.served, "requests": tally.kept,
            "latency": {"write": tally.storage["write"], "read": tally.storage["read"],
                        "e2e": tally.e2e, "wait": tally.wait,
                        "entry_write": tally.entries["write"],
                        "entry_read": tally.entries["read"]}, "qos": targets(table)}


def scored(tokens: int, wall: float, request_io_s: float, read: int, written: int) -> dict:
    """The release's scored figures of one run, by its definitions (kv_cache/benchmark.py and
    cache.py): tokens over the run's duration, tokens over the sum of every request's storage
    I/O time, the drive tier's bytes over the duration."""
    return {"tokens_per_s": tokens / wall if wall else 0.0,
            "storage_tokens_per_s": tokens / request_io_s if request_io_s else 0.0,
            "read_bw": read / wall if wall else 0.0,
            "write_bw": written / wall if wall else 0.0}


def remove(target: Target) -> None:
    if target.directory is not None:
        remove_made(target.directory / FOLDER, MANIFEST)
