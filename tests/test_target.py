"""Targets: scratch files qual owns, files it does not, identity, device counters, and the
safety guard on real loop devices (every refusal rule, and that nothing was written)."""

import errno
import hashlib
import os
import stat
import subprocess

import pytest

from qual import engine
from qual.engine import TargetUnavailable
from qual.targets import DEFAULT_TARGET, SCRATCH_NAME, Target, UnsafeTarget, guard_refusals, \
    marker_path
from qual.targets.scratch import own_tempdir, prove
from testbed import IS_ROOT, needs_root, sh, sha256_of

MiB = 1 << 20


# ------------------------------------------------------------------ files and directories


def test_directory_target_gets_a_scratch_file_with_real_blocks(tmp_path):
    t = Target(tmp_path)
    assert t.kind == "directory" and t.path == tmp_path / SCRATCH_NAME
    t.ensure_data(8 * MiB)
    st = t.path.stat()
    assert st.st_size == 8 * MiB and st.st_blocks * 512 >= 8 * MiB  # written, not sparse
    assert prove(t.path).written == 8 * MiB
    data = t.path.read_bytes()
    assert data.count(0) < len(data) // 100  # random data, not zeros


def test_scratch_file_grows_only_by_what_is_missing(tmp_path):
    t = Target(tmp_path / "t.dat")
    t.ensure_data(2 * MiB)
    head = t.path.read_bytes()
    t.ensure_data(4 * MiB)
    assert t.path.stat().st_size == 4 * MiB
    assert t.path.read_bytes()[:2 * MiB] == head


def test_default_target_is_made_under_dot_qual_only_when_needed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t = Target()
    assert t.spec == DEFAULT_TARGET and not (tmp_path / ".qual").exists()
    t.ensure_data(MiB)
    assert (tmp_path / DEFAULT_TARGET).stat().st_size == MiB


def test_cleanup_removes_only_what_qual_created(tmp_path):
    mine = Target(tmp_path)
    mine.ensure_data(MiB)
    theirs = tmp_path / "theirs.dat"
    theirs.write_bytes(b"x" * 4096)
    mine.cleanup()
    assert not mine.path.exists() and not marker_path(mine.path).exists()
    assert theirs.read_bytes() == b"x" * 4096
    Target(theirs).cleanup()  # not ours: left alone
    assert theirs.exists()


def test_a_file_qual_did_not_create_is_never_written(tmp_path):
    theirs = tmp_path / "theirs.dat"
    theirs.write_bytes(os.urandom(4 * MiB))
    before = sha256_of(theirs)
    t = Target(theirs)
    job = t.job(op="write", pattern="sequential", block_size=64 << 10, size=4 * MiB, bytes=MiB)
    with pytest.raises(TargetUnavailable, match="was not created by qual"):
        t.prepare(job)
    assert sha256_of(theirs) == before


def test_a_replaced_scratch_file_is_no_longer_qual_s(tmp_path):
    t = Target(tmp_path / "s.dat")
    t.ensure_data(MiB)
    t.path.unlink()
    t.path.write_bytes(b"user data")  # same name, another file (another inode)
    assert prove(t.path) is None
    t.cleanup()
    assert t.path.read_bytes() == b"user data"


def test_a_foreign_file_can_be_read_if_it_is_big_enough_and_not_sparse(tmp_path):
    full = tmp_path / "full.dat"
    full.write_bytes(os.urandom(2 * MiB))
    Target(full).ensure_data(2 * MiB)
    with pytest.raises(TargetUnavailable, match="qual does not extend files it did not create"):
        Target(full).ensure_data(4 * MiB)
    sparse = tmp_path / "sparse.dat"
    with open(sparse, "wb") as f:
        f.truncate(8 * MiB)
    with pytest.raises(TargetUnavailable, match="sparse"):
        Target(sparse).ensure_data(8 * MiB)


def test_a_killed_runs_temporary_folders_go_with_the_next_run_and_nothing_else(tmp_path,
                                                                                  monkeypatch):
    """A kill -9 runs no clean-up: the checkpoint launcher's folder and a mount point stay in
    the temporary folder. The next one of their kind removes those whose process is gone:
    never a live process's, another kind's, a file, or a mount point that is not empty."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now
    dead, live = gone.pid, os.getpid()
    for name in (f"qual-ckpt-{dead}-a", f"qual-ckpt-{live}-b", f"qual-fs-{dead}-c",
                 f"qual-fs-{dead}-d", f"qual-gnn-{dead}-e", "qual-ckpt-old"):
        (tmp_path / name).mkdir()
    (tmp_path / f"qual-ckpt-{dead}-a" / "ranks.log").write_text("a killed run's")
    (tmp_path / f"qual-fs-{dead}-d" / "x").write_text("not empty: not a bare mount point")
    (tmp_path / f"qual-ckpt-{dead}-f").write_text("a file")
    others = {f"qual-ckpt-{dead}-g"} if IS_ROOT else set()  # another user's
    for name in others:
        (tmp_path / name).mkdir()
        os.chown(tmp_path / name, 65534, 65534)
    made = own_tempdir("ckpt")
    assert made.parent == tmp_path and made.name.startswith(f"qual-ckpt-{live}-")
    left = {p.name for p in tmp_path.iterdir()} - {made.name}
    assert left == {f"qual-ckpt-{live}-b", f"qual-fs-{dead}-c", f"qual-fs-{dead}-d",
                    f"qual-gnn-{dead}-e", "qual-ckpt-old", f"qual-ckpt-{dead}-f"} | others
    point = own_tempdir("fs", whole=False)
    assert {p.name for p in tmp_path.iterdir()} - {made.name, point.name} == \
        left - {f"qual-fs-{dead}-c"}


def test_one_qual_run_at_a_time_per_target(tmp_path):
    first, second = Target(tmp_path), Target(tmp_path)
    first.lock()
    with pytest.raises(TargetUnavailable, match="another qual run holds this target"):
        second.lock()
    first.unlock()
    second.lock()
    second.unlock()
    assert not list(tmp_path.glob(".*.lock"))  # qual removes the lock file it made


def test_a_read_only_directory_is_a_target_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    sh("mount", "--bind", "-o", "ro", str(ro), str(ro)) if IS_ROOT else ro.chmod(0o500)
    try:
        with pytest.raises(TargetUnavailable, match="cannot create qual's scratch file") as e:
            Target(ro).ensure_data(MiB)
        assert e.value.errno in (errno.EROFS, errno.EACCES)
    finally:
        if IS_ROOT:
            sh("umount", str(ro))


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(TargetUnavailable) as e:
        Target(tmp_path / "absent" / "t.dat")
    assert e.value.errno == errno.ENOENT


def test_file_identity_names_the_device_underneath(tmp_path):
    t = Target(tmp_path)
    ident = t.identity
    assert ident.device and ident.filesystem and ident.mountpoint
    assert ident.logical_block_size in (512, 4096)
    assert t.align % ident.logical_block_size == 0


def test_device_counters_see_direct_reads(tmp_path):
    t = Target(tmp_path)
    t.ensure_data(8 * MiB)
    before = t.device_stat()
    if before is None:
        pytest.skip("no block device under the temporary directory")
    engine.run_job(t.job(op="read", pattern="sequential", block_size=MiB, size=8 * MiB,
                         bytes=8 * MiB))
    delta = t.device_stat().since(before)
    assert delta["read_bytes"] >= 8 * MiB


# ------------------------------------------------------------------ block devices and the guard


def write_job(t: Target, size=4 * MiB):
    return t.job(op="write", pattern="sequential", block_size=64 << 10, size=size, bytes=size)


def refused_despite_both_flags(dev, digest=sha256_of):
    """The rules that refuse a write even with --qual-allow-destructive and the right serial."""
    serial = Target(dev).identity.serial
    return refused_rules(dev, digest, allow_destructive=True, confirm_serial=serial)


def refused_rules(dev, digest=sha256_of, **kw):
    """The rules that refuse `write_job` (4 MiB from offset 0), its bytes unchanged by the
    refusal as `digest` sees them."""
    t = Target(dev, **kw)
    before = digest(dev)
    with pytest.raises(UnsafeTarget) as e:
        t.prepare(write_job(t))
    assert digest(dev) == before, "the guard let bytes through"
    return {r.rule for r in e.value.refusals}, str(e.value)


@needs_root
def test_clean_loop_device_is_written_only_with_both_flags(loop_device):
    dev = loop_device()
    serial = Target(dev).identity.serial
    assert serial and serial.endswith("loop.img")  # a loop device is named by its backing file
    rules, message = refused_rules(dev)
    assert rules == {"allow-destructive", "serial"}
    assert "need --allow-destructive" in message and "with --confirm-serial" in message
    _, message = refused_rules(dev, consent_flags=("--qual-allow-destructive",
                                                   "--qual-confirm-serial"))
    assert "need --qual-allow-destructive" in message and "with --qual-confirm-serial" in message
    assert refused_rules(dev, allow_destructive=True)[0] == {"serial"}
    assert refused_rules(dev, confirm_serial=serial)[0] == {"allow-destructive"}
    rules, message = refused_rules(dev, allow_destructive=True, confirm_serial="S0MEOTHER")
    assert rules == {"serial"} and "not the confirmed 'S0MEOTHER'" in message

    t = Target(dev, allow_destructive=True, confirm_serial=serial)
    before = sha256_of(dev)
    engine.run_job(t.prepare(write_job(t)))
    t.unlock()
    assert sha256_of(dev) != before


@needs_root
def test_mounted_loop_device_is_refused_and_untouched(loop_device):
    dev = loop_device()
    point = loop_device.mount(dev, options="ro")  # no background writes of ext4's own
    rules, message = refused_despite_both_flags(dev)
    assert rules == {"mounted", "signature"}
    assert str(point) in message and "ext4" in message


@needs_root
def test_the_exclusive_hold_is_refused_on_a_mounted_device(loop_device):
    """The kernel's own net behind the guard: the run's one O_EXCL open of a block device
    fails with EBUSY while the device is mounted."""
    dev = loop_device()
    loop_device.mount(dev)
    with pytest.raises(TargetUnavailable, match="in use") as e:
        Target(dev).claim()
    assert e.value.errno == errno.EBUSY


@needs_root
def test_partitioned_loop_device_is_refused_and_untouched(loop_device):
    dev = loop_device()
    part = loop_device.partition(dev)
    rules, message = refused_despite_both_flags(dev)
    assert rules == {"partitioned", "signature"}
    assert os.path.basename(part) in message and "dos partition table" in message


@needs_root
def test_loop_device_with_a_stale_filesystem_signature_is_refused(loop_device):
    dev = loop_device()
    sh("mkfs.ext4", "-q", "-F", dev)  # not mounted: only the signature says it holds data
    rules, message = refused_despite_both_flags(dev)
    assert rules == {"signature"} and "wipefs" in message


SWAP_AREA = 1 << 20  # the first MiB of the device is swap; the kernel never writes past it


def outside_swap_slots(dev) -> str:
    """The device's bytes that an active swap area leaves alone: its header page and what lies
    past the area. The kernel writes pages out into the slots in between whenever it likes
    (CI's memory pressure did, mid-test); a write of `write_job`'s would change both."""
    h = hashlib.sha256()
    with open(dev, "rb") as f:
        h.update(f.read(4096))
        f.seek(SWAP_AREA)
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


@needs_root
def test_swap_device_is_refused(loop_device):
    dev = loop_device()
    sh("mkswap", dev, str(SWAP_AREA // 1024))  # its size in KiB
    if subprocess.run(["swapon", dev], capture_output=True).returncode != 0:
        pytest.skip("swapon is not permitted here")
    try:
        rules, _ = refused_despite_both_flags(dev, outside_swap_slots)
        assert "swap" in rules
    finally:
        subprocess.run(["swapoff", dev], capture_output=True)


def test_root_filesystem_device_is_refused():
    """Only the guard's verdict is asked for: this test never writes."""
    root = os.stat("/").st_dev
    nodes = [e.path for e in os.scandir("/dev") if stat.S_ISBLK(e.stat().st_mode) and e.stat().st_rdev == root]
    if not nodes:
        pytest.skip("the root filesystem has no block device node here (overlay, tmpfs)")
    dev = nodes[0]
    t = Target(dev)
    rules = {r.rule for r in guard_refusals(dev, t.identity, allow_destructive=True,
                                            confirm_serial=t.identity.serial)}
    assert "root" in rules and "mounted" in rules
