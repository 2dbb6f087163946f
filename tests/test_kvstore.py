"""The KV-cache store's I/O (native/src/kv.c, qual.engine.KvStore): whole entries written to and
read back from their offsets of one store, each entry timed, a write batch made durable; the
device's own counters see every byte; bad entries are refused before any I/O; an I/O error
names its entry and offset."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from qual import engine
from qual.engine import DeviceIoError, Fault, InvalidJob, KvStore
from qual.targets import Target

from testbed import needs_root

BACKENDS = ["io_uring", "psync"]
MiB = 1 << 20


def entries_of(sizes: list[int], seed: int) -> list[tuple[int, np.ndarray]]:
    """Random entries laid out one after another from offset 0."""
    out, offset = [], 0
    for i, size in enumerate(sizes):
        buf = engine.aligned_empty(size)
        engine.fill_random(buf, seed + i)
        out.append((offset, buf))
        offset += size
    return out


def store_file(tmp_path, size: int = 16 * MiB) -> str:
    path = tmp_path / "kv.store"
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_entries_read_back_as_written_each_timed(tmp_path, backend):
    sizes = [4096, 256 << 10, 3 * MiB + 8192, 128 << 10]
    written = entries_of(sizes, seed=3)
    with KvStore(store_file(tmp_path), block_size=MiB, queue_depth=4, backend=backend) as kv:
        assert kv.backend == backend
        w = kv.write(written)
        back = [(off, engine.aligned_empty(len(buf))) for off, buf in written]
        r = kv.read(back)
    assert w.bytes == r.bytes == sum(sizes)
    assert len(w.latencies) == len(r.latencies) == len(sizes)
    assert (w.latencies > 0).all() and (r.latencies > 0).all()
    assert w.sync_s > 0 and r.sync_s == 0  # a write batch ends durable; a read has no sync
    assert (r.latencies <= r.io_s + 1e-6).all()  # an entry's time lies inside its batch's
    for (_, a), (_, b) in zip(written, back):
        assert np.array_equal(a, b)


def test_an_entry_larger_than_a_block_is_timed_from_first_piece_to_last(tmp_path):
    """An 8 MiB entry in 1 MiB pieces, one at a time, whose first and last pieces the storage
    each holds back 0.2 s: the entry's latency holds both waits (not only its slowest
    piece's), and it starts when the entry before it has come back."""
    small, big = entries_of([MiB, 8 * MiB], seed=5)
    held = tuple(Fault(op="read", delay=0.2, offset_lo=big[0] + at, offset_hi=big[0] + at + MiB)
                 for at in (0, 7 * MiB))
    with KvStore(store_file(tmp_path), block_size=MiB, queue_depth=1, faults=held) as kv:
        kv.write([small, big])
        got = kv.read([(small[0], engine.aligned_empty(MiB)),
                       (big[0], engine.aligned_empty(8 * MiB))])
    assert got.latencies[1] >= 0.4 and got.latencies[0] > 0
    assert got.starts[0] < 0.01 and got.starts[1] >= got.latencies[0]
    assert got.starts[1] + got.latencies[1] <= got.io_s + 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_entry_longer_than_its_buffer_repeats_it(tmp_path, backend):
    """A 5 MiB entry from a 1 MiB buffer: the store holds the buffer five times over, all of
    it moved and counted; read back through a 1 MiB buffer, the entry's bytes all pass."""
    buf = engine.aligned_empty(MiB)
    engine.fill_random(buf, 21)
    path = store_file(tmp_path)
    with KvStore(path, block_size=256 << 10, queue_depth=4, backend=backend) as kv:
        w = kv.write([(MiB, buf, 5 * MiB)])
        sink = engine.aligned_empty(MiB)
        r = kv.read([(MiB, sink, 5 * MiB)])
    assert w.bytes == r.bytes == 5 * MiB and len(w.latencies) == 1
    held = np.fromfile(path, dtype=np.uint8)
    for i in range(1, 6):
        assert np.array_equal(held[i * MiB:(i + 1) * MiB], buf), i
    assert not held[:MiB].any() and not held[6 * MiB:].any()
    assert np.array_equal(sink, buf)


def test_a_repeated_buffer_that_is_not_whole_blocks_is_refused(tmp_path):
    with KvStore(store_file(tmp_path), block_size=MiB) as kv, \
            pytest.raises(InvalidJob, match="not a multiple of the block size"):
        kv.write([(0, engine.aligned_empty(512 << 10), 2 * MiB)])


@pytest.mark.parametrize("bad, said", [
    ((1000, 4096), "not aligned to 4096 bytes"),       # offset
    ((0, 5000), "not aligned to 4096 bytes"),          # length
])
def test_a_misaligned_entry_is_refused_before_any_io(tmp_path, bad, said):
    offset, size = bad
    path = store_file(tmp_path)
    with KvStore(path, block_size=MiB) as kv, pytest.raises(InvalidJob, match=said):
        kv.write([entries_of([4096], seed=2)[0], (offset, engine.aligned_empty(size + 4096)[:size])])
    assert not np.any(np.fromfile(path, dtype=np.uint8, count=8192))  # nothing was written


def test_an_io_error_names_its_entry_and_offset(tmp_path):
    fault = Fault(op="read", error=errno.EIO, offset_lo=2 * MiB, offset_hi=2 * MiB + 4096)
    written = entries_of([MiB, MiB, MiB], seed=9)
    with KvStore(store_file(tmp_path), block_size=256 << 10, faults=(fault,)) as kv:
        kv.write(written)
        with pytest.raises(DeviceIoError) as e:
            kv.read([(off, engine.aligned_empty(MiB)) for off, _ in written])
    assert "entry 2" in str(e.value) and f"offset {2 * MiB}" in str(e.value)


@needs_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_device_counts_every_byte_on_a_raw_store(loop_device, backend):
    """A block device as the store: its own counters see each batch's bytes (O_DIRECT: no
    byte served by the page cache)."""
    dev = loop_device(32 * MiB)
    target = Target(dev)
    written = entries_of([MiB, 2 * MiB, 512 << 10], seed=11)
    total = sum(len(b) for _, b in written)
    with KvStore(dev, block_size=MiB, queue_depth=4, backend=backend) as kv:
        before = target.device_stat()
        kv.write(written)
        middle = target.device_stat()
        kv.read([(off, engine.aligned_empty(len(b))) for off, b in written])
        after = target.device_stat()
    assert middle.since(before)["write_bytes"] >= total
    assert after.since(middle)["read_bytes"] >= total


def test_a_write_batch_includes_its_fdatasync(misbehaving):
    """On a file system whose flushes take a second, the batch's sync time holds it; the file
    system sees each batch's writes, then its flush, and a read batch flushes nothing."""
    storage = misbehaving("--fsync-delay", "1", size=4 * MiB)
    with KvStore(str(storage.file), block_size=MiB, direct=False) as kv:
        w = kv.write(entries_of([MiB], seed=1))
        flushed = storage.requests()
        kv.read([(0, engine.aligned_empty(MiB))])
    assert w.sync_s >= 1.0, f"{w.sync_s:.3f} s: the flush was not timed"
    ops = [op for op, path in flushed if path == "stall.dat" and op in ("WRITE", "FSYNC")]
    assert ops[-1] == "FSYNC" and "WRITE" in ops[:-1], flushed
    assert storage.requests().count(("FSYNC", "stall.dat")) == ops.count("FSYNC")
