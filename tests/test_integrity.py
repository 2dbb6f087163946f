"""Data integrity: verification blocks on real files and loop devices. A clean region checks
clean in both orders; a flipped byte, a stale block and a misdirected block are each found and
named; faults surface as errors naming the target, the operation and the offset; a guarded
device is refused and left untouched."""

from __future__ import annotations

import errno

import pytest
from testbed import TINY_ALL, flip_byte, load_record, needs_root, overwrite, run_suite, sha256_of

from qual import engine
from qual.engine import Fault, verify_block, verify_blocks
from qual.targets import Target, UnsafeTarget
from qual.thresholds import ProfileError, family_table
from qual.workloads import integrity

BS = 64 << 10
SIZE = 64 * BS
SEED = 0x5EED


def region(tmp_path, name="blocks.dat"):
    path = tmp_path / name
    with open(path, "wb") as f:
        f.truncate(SIZE)
    return str(path)


def write(path, seq, *, random=False, **kw):
    return verify_blocks(path, op="write", block_size=BS, queue_depth=8, offset=0, size=SIZE,
                         seed=SEED, seq=seq, random=random, **kw)


def check(path, seq, *, random=False, seed=SEED, **kw):
    return verify_blocks(path, op="read", block_size=BS, queue_depth=8, offset=0, size=SIZE,
                         seed=seed, seq=seq, random=random, **kw)


@pytest.mark.parametrize("backend", ["io_uring", "psync"])
@pytest.mark.parametrize("random", [False, True])
def test_a_clean_region_checks_clean(tmp_path, backend, random):
    path = region(tmp_path)
    w = write(path, 1, random=random, backend=backend)
    assert w.blocks == SIZE // BS and w.backend == backend
    c = check(path, 1, random=random, backend=backend)
    assert c.blocks == SIZE // BS and c.bad_blocks == 0 and c.bad == ()


def test_random_order_writes_every_block_exactly_once(tmp_path):
    """Over a zeroed file, a random-order write leaves no block unwritten (a hole would read
    back as corrupted), for block counts prime and composite."""
    for blocks in (61, 64, 100):
        path = tmp_path / f"r{blocks}"
        path.write_bytes(b"\0" * blocks * BS)
        verify_blocks(str(path), op="write", block_size=BS, queue_depth=4, offset=0,
                      size=blocks * BS, seed=blocks, seq=1, random=True)
        c = verify_blocks(str(path), op="read", block_size=BS, queue_depth=4, offset=0,
                          size=blocks * BS, seed=blocks, seq=1)
        assert c.bad_blocks == 0, (blocks, c.bad[:3])


def test_one_flipped_byte_is_a_corrupted_block_named_by_offset(tmp_path):
    path = region(tmp_path)
    write(path, 1)
    flip_byte(path, 17 * BS + 4000, 0x01)
    c = check(path, 1)
    assert c.counts == {"corrupted": 1, "foreign": 0, "misdirected": 0, "stale": 0,
                        "unreadable": 0}
    (bad,) = c.bad
    assert bad.offset == 17 * BS and bad.kind == "corrupted"
    assert bad.describe().startswith(f"offset {17 * BS}: corrupted")


def test_a_lost_write_leaves_a_stale_block(tmp_path):
    path = region(tmp_path)
    write(path, 1)
    with open(path, "rb") as f:
        f.seek(5 * BS)
        old = f.read(BS)
    write(path, 2)
    overwrite(path, 5 * BS, old)  # as if the drive had dropped generation 2 of block 5
    c = check(path, 2)
    assert c.counts["stale"] == 1 and c.bad_blocks == 1
    (bad,) = c.bad
    assert (bad.offset, bad.kind, bad.found_seq) == (5 * BS, "stale", 1)


def test_a_block_at_the_wrong_offset_is_misdirected(tmp_path):
    path = region(tmp_path)
    write(path, 1)
    overwrite(path, 9 * BS, verify_block(BS, 40 * BS, SEED, 1))  # block 40's data at 9
    c = check(path, 1)
    (bad,) = c.bad
    assert (bad.offset, bad.kind, bad.found_offset) == (9 * BS, "misdirected", 40 * BS)
    assert "offset 2621440" in bad.describe()


@pytest.mark.parametrize("random", [False, True])
def test_another_runs_blocks_are_foreign_and_the_report_is_capped(tmp_path, random):
    """The report keeps the lowest offsets, in order, whatever order the reads completed in."""
    path = region(tmp_path)
    write(path, 1)
    c = check(path, 1, seed=SEED + 1, max_report=5, random=random)
    assert c.counts["foreign"] == SIZE // BS and len(c.bad) == 5
    assert [b.offset for b in c.bad] == [i * BS for i in range(5)]


def test_an_injected_write_eio_names_target_op_and_offset(tmp_path):
    path = region(tmp_path)
    write(path, 1)
    fault = Fault(op="write", error=errno.EIO, offset_lo=20 * BS, offset_hi=21 * BS)
    with pytest.raises(engine.DeviceIoError) as e:
        write(path, 1, faults=(fault,))
    assert e.value.target == path and e.value.op == "write" and f"offset {20 * BS}" in str(e.value)


@pytest.mark.parametrize("fault, errno_name", [
    (Fault(op="read", error=errno.EIO, offset_lo=20 * BS, offset_hi=21 * BS), "EIO"),
    (Fault(op="read", error=errno.ENODATA, offset_lo=20 * BS, offset_hi=21 * BS), "ENODATA"),
    (Fault(op="read", short_bytes=4096, offset_lo=20 * BS, offset_hi=21 * BS), "EIO"),
])
def test_a_block_the_drive_cannot_read_is_named_and_the_check_goes_on(tmp_path, fault,
                                                                      errno_name):
    """A medium error (EIO, ENODATA) or a short read is the drive's answer for that block: an
    unreadable block, named by offset and errno, and every other block is still checked."""
    path = region(tmp_path)
    write(path, 1)
    c = check(path, 1, faults=(fault,))
    assert c.counts["unreadable"] == c.bad_blocks == 1 and c.blocks == SIZE // BS
    (bad,) = c.bad
    assert bad.offset == 20 * BS and bad.kind == "unreadable"
    assert bad.describe().startswith(f"offset {20 * BS}: unreadable: the drive answered its "
                                     f"read with {errno_name}")
    assert c.bytes == SIZE - BS  # verified: every block but that one


def test_a_read_error_that_is_not_the_drives_answer_is_an_error(tmp_path):
    path = region(tmp_path)
    write(path, 1)
    with pytest.raises(engine.QualError) as e:
        check(path, 1, faults=(Fault(op="read", error=errno.EINVAL, offset_lo=3 * BS,
                                     offset_hi=4 * BS),))
    assert e.value.errno == errno.EINVAL and f"offset {3 * BS}" in str(e.value)


def test_bad_parameters_are_refused_before_any_io(tmp_path):
    path = region(tmp_path)
    before = sha256_of(path)
    for kw in ({"block_size": 1000}, {"size": SIZE + 7}, {"queue_depth": 0}):
        args = dict(op="write", block_size=BS, queue_depth=8, offset=0, size=SIZE, seed=1, seq=1)
        with pytest.raises(engine.InvalidJob):
            verify_blocks(path, **{**args, **kw})
    assert sha256_of(path) == before
    with pytest.raises(ProfileError) as e:
        family_table(integrity.FAMILY, {"size": "1000000", "block_size": "64K"})
    assert any(k.endswith("size") for _, k, _ in e.value.problems)


def test_the_workload_checks_every_generation_on_a_directory_target(tmp_path):
    table = family_table(integrity.FAMILY, {"size": "2 MiB", "block_size": "64K",
                                          "queue_depth": 4, "generations": 3})
    target = Target(tmp_path)
    result = integrity.run_pattern(target, table, "random")
    assert len(result["writes"]) == 3 and result["check"].bad_blocks == 0
    ms = {m.metric: m for m in integrity.measurements(result, target)}
    assert ms["integrity_bad_blocks"].value == 0 and ms["integrity_verified"].value == 2 << 20


# ------------------------------------------------------------------ block devices, guarded


@needs_root
def test_a_guarded_loop_device_is_refused_and_untouched(loop_device):
    dev = loop_device(16 << 20)
    table = family_table(integrity.FAMILY, {"size": "4 MiB", "block_size": "64K"})
    before = sha256_of(dev)
    for target in (Target(dev), Target(dev, allow_destructive=True, confirm_serial="wrong")):
        with pytest.raises(UnsafeTarget):
            integrity.run_pattern(target, table, "sequential")
    assert sha256_of(dev) == before


@needs_root
def test_a_confirmed_loop_device_is_verified(loop_device):
    dev = loop_device(16 << 20)
    probe = Target(dev)
    target = Target(dev, allow_destructive=True, confirm_serial=probe.identity.serial)
    table = family_table(integrity.FAMILY, {"size": "4 MiB", "block_size": "64K"})
    result = integrity.run_pattern(target, table, "sequential")
    assert result["check"].bad_blocks == 0 and result["check"].blocks == 64


def test_the_integrity_suite_passes_and_records(tmp_path):
    proc, results = run_suite(tmp_path, suite="test_integrity.py", profile=TINY_ALL)
    record = load_record(results)
    assert record["summary"]["checks_failed"] == 0, proc.stdout[-3000:]
    judged = {v["id"] for t in record["tests"] for v in t["verdicts"]}
    assert "integrity_bad_blocks[pattern=random]" in judged
