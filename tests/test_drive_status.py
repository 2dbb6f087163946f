"""What a drive answered a failed I/O (qual/targets/drive_status.py), read from a log in
/dev/kmsg's format as the NVMe driver writes it; the driver itself writes it in the emulated
drive's test (tests/test_nvme_drive.py)."""

from __future__ import annotations

import errno

from qual.targets import drive_status

LOG = """6,900,1000000,-;nvme0n1: I/O Cmd(0x2) @ LBA 4096, 8 blocks, I/O Error (sct 0x2 / sc 0x81) DNR
3,901,5000000,-;nvme1n1: I/O Cmd(0x1) @ LBA 99840, 512 blocks, I/O Error (sct 0x2 / sc 0x80) DNR
3,902,5000100,-;critical medium error, dev nvme1n1, sector 99840 op 0x1:(WRITE) flags 0x8800
3,903,5000200,-;nvme1c1n1: Read(0x2) @ LBA 200000, 256 blocks, Unrecovered Read Error (sct 0x2 / sc 0x81) DNR
3,904,5000300,-;nvme1n1: I/O Cmd(0x2) @ LBA 7, 1 blocks, I/O Error (sct 0x0 / sc 0x4)
"""


def said(tmp_path, **kw):
    log = tmp_path / "kmsg"
    log.write_text(LOG)
    args = {"since": 2.0, "offset": None, "lba_size": 512, **kw}
    return drive_status.said(args.pop("disk", "nvme1n1"), errno.ENODATA, kmsg=str(log), **args)


def test_the_command_that_held_the_failed_offset_is_named_with_its_nvme_status(tmp_path):
    found = said(tmp_path, offset=100_000 * 512)
    assert found == {"status": "Write Fault (sct 0x2 / sc 0x80)", "command": "Write",
                     "lba": 99840, "blocks": 512, "lba_size": 512, "source": "kernel log"}
    assert drive_status.describe(found) == ("the drive answered Write at LBA 99,840 (+512 "
                                            "blocks of 512 B): Write Fault (sct 0x2 / sc 0x80)")


def test_a_multipath_paths_line_is_its_namespaces_and_the_newest_line_wins(tmp_path):
    found = said(tmp_path, offset=200_100 * 512)
    assert found["status"] == "Unrecovered Read Error (sct 0x2 / sc 0x81)"
    assert said(tmp_path)["status"] == "Data Transfer Error (sct 0x0 / sc 0x04)"  # no offset


def test_lines_before_the_test_began_and_other_namespaces_are_not_taken(tmp_path):
    assert said(tmp_path, disk="nvme0n1")["source"] == "errno"  # logged at 1 s, since 2 s
    found = said(tmp_path, since=6.0, offset=8192)
    assert found == {"status": "critical medium error (ENODATA, the block layer's word: the "
                               "kernel logged no NVMe status for it)", "command": None,
                     "lba": 16, "blocks": None, "lba_size": 512, "source": "errno"}
    assert drive_status.describe(found).startswith("the drive answered the I/O at LBA 16 "
                                                   "(blocks of 512 B): critical medium error")


def test_an_unreadable_log_leaves_the_errnos_meaning(tmp_path):
    found = drive_status.said("nvme1n1", errno.EIO, since=0, offset=None, lba_size=4096,
                              kmsg=str(tmp_path / "none"))
    assert found["status"].startswith("I/O error (EIO") and found["lba"] is None


def test_a_failed_write_is_answered_by_a_write_command_not_a_later_read(tmp_path):
    # the newest line is a read's (LBA 7): a failed write takes the Write command's status
    assert said(tmp_path, op="write")["status"] == "Write Fault (sct 0x2 / sc 0x80)"
    assert said(tmp_path, op="read")["status"] == "Data Transfer Error (sct 0x0 / sc 0x04)"
    # nvme0n1 logged a read only: its failed write is known by its errno alone
    assert said(tmp_path, disk="nvme0n1", since=0, op="write")["source"] == "errno"
