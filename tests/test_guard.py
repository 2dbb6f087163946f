"""Every way round the safety guard that was found, tried on real loop devices as an attacker
and as a careless operator would: each is refused with a message naming the rule, and a hash
of the device proves that not one byte changed. The positive controls (a blank device with
every flag right) prove that these tests can see a write."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from qual import cli, engine
from qual.engine import TargetUnavailable
from qual.targets import SCRATCH_NAME, Target, UnsafeTarget, marker_path
from qual.targets.guard import signatures

from testbed import needs_root, sh, sha256_of

MiB = 1 << 20
pytestmark = needs_root


def qual_io(capsys, target: str, *flags: str) -> tuple[int, str, str]:
    rc = cli.main(["io", "--target", target, "--rw", "write", "--bs", "64k", "--size", "4M",
                   *flags])
    out = capsys.readouterr()
    return rc, out.out, out.err


def confirmed(dev: str) -> list[str]:
    return ["--allow-destructive", "--confirm-serial", Target(dev).identity.serial]


def forge_marker(scratch_path, node: str) -> None:
    """A marker beside the scratch name, as a third party could write it: the right format,
    naming the inode the scratch name leads to, and a token of the forger's choosing."""
    st = os.stat(node)
    marker_path(scratch_path).write_text(json.dumps({
        "created_by": "qual", "dev": st.st_dev, "inode": st.st_ino, "generation": None,
        "token": "0" * 32, "written": 1 << 40, "fill_seed": 0x7175616C}))


# ------------------------------------------------------------------ 1. a forged marker and a link


@pytest.mark.parametrize("how", ["symlink", "mknod"])
def test_a_forged_marker_does_not_lead_qual_onto_a_device(tmp_path, loop_device, capsys, how):
    """A scratch name that leads to a block device (a link, or a device node made there),
    with a marker beside it: no flags at all, and qual must not write the device."""
    dev = loop_device()
    folder = tmp_path / "shared-scratch"
    folder.mkdir()
    scratch_path = folder / SCRATCH_NAME
    if how == "symlink":
        scratch_path.symlink_to(dev)
    else:
        st = os.stat(dev)
        os.mknod(scratch_path, 0o600 | 0o060000, st.st_rdev)  # S_IFBLK
    forge_marker(scratch_path, str(scratch_path))
    before = sha256_of(dev)
    rc, _, err = qual_io(capsys, str(folder))
    assert rc == 1 and "was not created by qual" in err, err
    assert sha256_of(dev) == before
    Target(folder).cleanup()
    assert os.path.lexists(scratch_path)  # not qual's: never removed either


def test_a_forged_marker_on_a_file_of_someone_else_is_refused(tmp_path, capsys):
    """The same trick with a regular file that qual did not create (a hard link or a file
    moved into place): the marker names its inode, but the file carries no token of qual's."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    victim = folder / SCRATCH_NAME
    victim.write_bytes(os.urandom(4 * MiB))
    forge_marker(victim, str(victim))
    before = sha256_of(victim)
    rc, _, err = qual_io(capsys, str(folder))
    assert rc == 1 and "was not created by qual" in err, err
    assert sha256_of(victim) == before


def test_a_marker_that_matches_the_inode_but_not_the_token_is_refused(tmp_path, capsys):
    """A scratch file that qual did sign, whose marker was replaced by one matching its inode,
    owner and generation but carrying another token (a second qual's marker copied over, or a
    forger who read the inode): only the token tells them apart, and it must."""
    from qual.targets import scratch

    folder = tmp_path / "scratch"
    folder.mkdir()
    made = scratch.create(folder / SCRATCH_NAME)
    assert scratch.prove(made.path) is not None  # the control: the real marker proves it
    doc = json.loads(marker_path(made.path).read_text())
    doc["token"] = "0" * 32
    marker_path(made.path).write_text(json.dumps(doc))
    assert scratch.prove(made.path) is None
    rc, _, err = qual_io(capsys, str(folder))
    assert rc == 1 and "was not created by qual" in err, err


def test_a_scratch_file_swapped_after_the_check_is_not_written(tmp_path):
    """The engine opens only the inode the target checked: a link or another file put in the
    scratch file's place between prepare() and the job is refused on the engine's own
    descriptor."""
    t = Target(tmp_path)
    job = t.prepare(t.job(op="write", pattern="sequential", block_size=64 << 10, size=MiB,
                          bytes=MiB))
    victim = tmp_path / "victim.dat"
    victim.write_bytes(os.urandom(MiB))
    before = sha256_of(victim)
    t.path.unlink()
    t.path.symlink_to(victim)
    with pytest.raises(TargetUnavailable, match="symbolic link"):
        engine.run_job(job)
    t.path.unlink()
    os.link(victim, t.path)
    with pytest.raises(TargetUnavailable, match="no longer the file or device that was checked"):
        engine.run_job(job)
    assert sha256_of(victim) == before


# ------------------------------------------------------------------ 2-4. signature probes fail closed


def test_a_missing_blkid_refuses(loop_device, capsys, monkeypatch):
    """As under cron: a PATH without /usr/sbin, where blkid and wipefs live."""
    dev = loop_device()
    sh("mkfs.ext4", "-q", "-F", dev)
    flags = confirmed(dev)
    before = sha256_of(dev)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert shutil.which("blkid") is None
    rc, _, err = qual_io(capsys, dev, *flags)
    assert rc == 1 and "signature: blkid was not found on PATH" in err, err
    assert sha256_of(dev) == before


@pytest.mark.skipif(not shutil.which("mkfs.vfat"), reason="needs mkfs.vfat (dosfstools)")
def test_an_ambiguous_signature_refuses(tmp_path, loop_device, capsys):
    """An ext4 device with an old FAT boot sector left in its unused first sector: blkid -p
    exits 8 ("ambivalent result") and prints nothing."""
    dev = loop_device()
    sh("mkfs.ext4", "-q", "-F", "-b", "4096", dev)
    fat = tmp_path / "fat.img"
    with open(fat, "wb") as f:
        f.truncate(64 * MiB)
    sh("mkfs.vfat", str(fat))
    with open(fat, "rb") as src, open(dev, "r+b") as dst:
        dst.write(src.read(512))
        dst.flush()
        os.fsync(dst.fileno())
    before = sha256_of(dev)
    rc, _, err = qual_io(capsys, dev, *confirmed(dev))
    assert rc == 1 and "blkid -p gave no definite answer" in err, err
    assert "ext4" in err and "vfat" in err  # wipefs names both
    assert sha256_of(dev) == before


@pytest.mark.skipif(not shutil.which("sfdisk"), reason="needs sfdisk (fdisk)")
def test_a_surviving_backup_gpt_refuses(loop_device, capsys, monkeypatch):
    """A GPT disk whose first two sectors were zeroed: blkid sees nothing, the backup GPT at
    the end is still there. Seen by wipefs, and by qual's own scan even without the tools."""
    dev = loop_device()
    import subprocess
    subprocess.run(["sfdisk", "-q", "--no-reread", dev], input="label: gpt\n,8M\n", text=True,
                   capture_output=True, check=False)
    with open(dev, "r+b") as f:
        f.write(bytes(1024))
        f.flush()
        os.fsync(f.fileno())
    assert subprocess.run(["blkid", "-p", dev], capture_output=True).returncode == 2
    before = sha256_of(dev)
    rc, _, err = qual_io(capsys, dev, *confirmed(dev))
    assert rc == 1 and "wipefs finds gpt" in err, err
    assert "a backup GPT header at the last LBA" in err
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert any("a backup GPT header at the last LBA" in s for s in signatures(dev))
    assert sha256_of(dev) == before


# ------------------------------------------------------------------ 5. a path under /dev


@pytest.mark.parametrize("name", ["qual-absent-p9", "shm/qual-not-a-device.dat"])
def test_a_path_under_dev_that_is_no_block_device_is_refused_never_created(capsys, name,
                                                                           loop_device):
    dev = loop_device()
    target = f"/dev/{name}"
    assert not os.path.lexists(target)
    rc, _, err = qual_io(capsys, target, *confirmed(dev))
    assert rc == 1 and "under /dev only an existing block device is a target" in err, err
    assert not os.path.lexists(target)


# ------------------------------------------------------------------ one exclusive hold, many workers


def test_numjobs_4_writes_a_confirmed_blank_device(loop_device, capsys):
    """The positive control: every flag right, four workers, one exclusive hold."""
    dev = loop_device()
    before = sha256_of(dev)
    rc, out, err = qual_io(capsys, dev, "--numjobs", "4", "--json", *confirmed(dev))
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["bytes"] == 4 * MiB and doc["numjobs"] == 4
    assert sha256_of(dev) != before


def test_the_hold_keeps_another_exclusive_user_out(loop_device):
    dev = loop_device()
    t = Target(dev, allow_destructive=True, confirm_serial=Target(dev).identity.serial)
    t.lock()
    t.prepare(t.job(op="write", pattern="sequential", block_size=4096, size=MiB, bytes=MiB))
    with pytest.raises(OSError) as e:
        os.close(os.open(dev, os.O_RDONLY | os.O_EXCL))
    assert e.value.errno == 16  # EBUSY: a mount or mkfs would be refused too
    t.unlock()
    os.close(os.open(dev, os.O_RDONLY | os.O_EXCL))  # released at the end of the run


# ------------------------------------------------------------------ partitions: the whole disk


def test_a_mounted_sibling_refuses_the_disk_and_every_partition(loop_device, capsys):
    dev = loop_device(64 * MiB)
    first = loop_device.partition(dev, count=2)
    second = f"{dev}p2"
    point = loop_device.mount(second, options="ro")  # no background writes of ext4's own
    for target in (dev, first, second):
        before = sha256_of(target)
        rc, _, err = qual_io(capsys, target, *confirmed(target))
        assert rc == 1 and "mounted" in err and str(point) in err, (target, err)
        assert sha256_of(target) == before
    with pytest.raises(UnsafeTarget) as e:
        Target(first, allow_destructive=True, confirm_serial=Target(dev).identity.serial) \
            .ensure_writable(MiB)
    assert {r.rule for r in e.value.refusals} == {"mounted", "signature"}  # p2's ext4 too


def test_a_blank_partition_of_a_blank_disk_can_be_written(loop_device, capsys):
    """The positive control for partitions: nothing else on the disk is in use or holds data."""
    dev = loop_device(64 * MiB)
    first = loop_device.partition(dev, count=2)
    before = sha256_of(first)
    rc, _, err = qual_io(capsys, first, *confirmed(first))
    assert rc == 0, err
    assert sha256_of(first) != before


# ------------------------------------------------------------------ qual's folders in a target


@pytest.mark.parametrize("planted", ["symlink", "other-owner", "world-writable"])
def test_a_folder_planted_where_qual_makes_its_own_is_refused(tmp_path, planted):
    """A checkpoint folder made in advance by someone else (a link elsewhere, their own
    folder, or one anyone can write), with qual's marker forged inside, could hold links
    where qual will create files."""
    from qual.workloads.checkpoint.store import MARKER, ROOT_NAME, CheckpointStore

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / ROOT_NAME
    if planted == "symlink":
        root.symlink_to(elsewhere)
    else:
        root.mkdir()
        if planted == "other-owner":
            os.chown(root, 65534, 65534)
        else:
            root.chmod(0o777)
    (root / MARKER).write_text(json.dumps({"created_by": "qual"}))
    before = sorted(p.name for p in elsewhere.iterdir())
    with pytest.raises(TargetUnavailable, match="not a folder qual can trust"):
        CheckpointStore(tmp_path).create()
    assert sorted(p.name for p in elsewhere.iterdir()) == before
