"""What a drive answered an I/O it failed: the NVMe status the kernel logged for the command
(named as the NVMe base specification names it) and the command's LBAs in the drive's own
blocks; where the kernel log says nothing (not NVMe, no right to read it), the errno's meaning
in the block layer, which is all the kernel handed qual.

The NVMe driver logs every failed command (`nvme0n1: I/O Cmd(0x2) @ LBA 99840, 512 blocks,
I/O Error (sct 0x2 / sc 0x81) DNR`, or with the opcode and status spelled out where the kernel
was built with verbose errors); the completion carries no finer LBA than the command's range,
so that range is what qual names. The log is read from /dev/kmsg, whose time stamps are
CLOCK_MONOTONIC, so only what was logged since the failing test began is taken."""

from __future__ import annotations

import errno as errno_mod
import os
import re

from qual.errors import errno_name

# the driver's line, with or without CONFIG_NVME_VERBOSE_ERRORS
LOGGED = re.compile(r"(?P<disk>nvme\d+(?:c\d+)?n\d+): (?P<cmd>.+?)\(0x(?P<opcode>[0-9a-f]+)\) "
                    r"@ LBA (?P<lba>\d+), (?P<blocks>\d+) blocks, (?P<status>.+?) "
                    r"\(sct 0x(?P<sct>[0-9a-f]+) / sc 0x(?P<sc>[0-9a-f]+)\)")

OPCODES = {0x00: "Flush", 0x01: "Write", 0x02: "Read", 0x04: "Write Uncorrectable",
           0x05: "Compare", 0x08: "Write Zeroes", 0x09: "Dataset Management"}

# (status code type, status code) -> name: the generic and media errors an I/O command meets
STATUS = {
    (0, 0x04): "Data Transfer Error", (0, 0x05): "Commands Aborted due to Power Loss "
    "Notification", (0, 0x06): "Internal Error", (0, 0x07): "Command Abort Requested",
    (0, 0x08): "Command Aborted due to SQ Deletion", (0, 0x0B): "Invalid Namespace or Format",
    (0, 0x80): "LBA Out of Range", (0, 0x81): "Capacity Exceeded",
    (0, 0x82): "Namespace Not Ready", (1, 0x82): "Attempted Write to Read Only Range",
    (2, 0x80): "Write Fault", (2, 0x81): "Unrecovered Read Error",
    (2, 0x82): "End-to-end Guard Check Error", (2, 0x83): "End-to-end Application Tag Check "
    "Error", (2, 0x84): "End-to-end Reference Tag Check Error", (2, 0x85): "Compare Failure",
    (2, 0x86): "Access Denied", (2, 0x87): "Deallocated or Unwritten Logical Block",
    (3, 0x00): "Internal Path Error", (3, 0x71): "Transient Transport Error",
}

# the block layer's words for the errno a failed request ends with (block/blk-core.c)
BLOCK_LAYER = {
    errno_mod.EOPNOTSUPP: "operation not supported", errno_mod.ETIMEDOUT: "timeout",
    errno_mod.ENOSPC: "critical space allocation", errno_mod.ENOLINK: "recoverable transport",
    errno_mod.EREMOTEIO: "critical target", errno_mod.EBADE: "critical nexus",
    errno_mod.ENODATA: "critical medium", errno_mod.EILSEQ: "protection",
    errno_mod.ENOMEM: "kernel resource", errno_mod.EBUSY: "device resource",
    errno_mod.EAGAIN: "nonblocking retry", errno_mod.EIO: "I/O",
}


def logged_errors(disk: str, since: float, kmsg: str = "/dev/kmsg") -> list[dict]:
    """The NVMe driver's failed-command lines for namespace `disk` (nvme0n1) logged at or after
    `since` (time.monotonic()), oldest first; [] where the log cannot be read."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    found, buf = [], ""
    try:
        while True:
            try:
                chunk = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as e:
                if e.errno == errno_mod.EPIPE:  # overwritten while reading: go on
                    continue
                break
            if not chunk:
                break
            # /dev/kmsg gives one record a read ("prio,seq,usec,flags;text", continuation
            # lines indented); a copy of it in a file gives many
            *lines, buf = (buf + chunk).split("\n")
            for line in lines:
                head, sep, text = line.partition(";")
                fields = head.split(",")
                if not sep or len(fields) < 3 or not fields[2].isdigit() or \
                        int(fields[2]) < since * 1e6:
                    continue
                m = LOGGED.search(text)
                if m and _same_namespace(m.group("disk"), disk):
                    found.append(m.groupdict())
    finally:
        os.close(fd)
    return found


def _same_namespace(logged: str, disk: str) -> bool:
    """nvme0c0n1 (a multipath controller's path) is namespace nvme0n1 for the block layer."""
    return re.sub(r"c\d+n", "n", logged) == disk


def said(disk: str | None, err: int, *, since: float, offset: int | None,
         lba_size: int | None, op: str | None = None, kmsg: str = "/dev/kmsg") -> dict:
    """What the drive answered, for the record and the failure's message: `status` (its NVMe
    name with sct/sc, or the errno's block-layer meaning), `command`, `lba` and `blocks` (the
    failed command's range in the drive's blocks, where known), `lba_size`, `source`. `op`
    (read, write): the failed I/O's, so a write's answer is a Write command's, never a read's
    of the same blocks in the same test (udev's probe, say): where the kernel logged none (it
    rate-limits these lines), the errno's meaning is what is known."""
    lines = logged_errors(disk, since, kmsg) if disk else []
    if op in ("read", "write"):
        lines = [x for x in lines if OPCODES.get(int(x["opcode"], 16)) == op.title()]
    if offset is not None and lba_size:
        at = offset // lba_size  # a block device's offset: the command must hold it
        holding = [x for x in lines if int(x["lba"]) <= at < int(x["lba"]) + int(x["blocks"])]
        lines = holding or lines
    if lines:
        x = lines[-1]
        sct, sc = int(x["sct"], 16), int(x["sc"], 16)
        opcode = int(x["opcode"], 16)
        return {"status": f"{STATUS.get((sct, sc), x['status'])} (sct {sct:#x} / sc {sc:#04x})",
                "command": OPCODES.get(opcode, x["cmd"]), "lba": int(x["lba"]),
                "blocks": int(x["blocks"]), "lba_size": lba_size, "source": "kernel log"}
    return {"status": f"{BLOCK_LAYER.get(err, 'I/O')} error ({errno_name(err)}, the block "
            "layer's word: the kernel logged no NVMe status for it)",
            "command": None, "lba": offset // lba_size if offset is not None and lba_size
            else None, "blocks": None, "lba_size": lba_size, "source": "errno"}


def describe(found: dict) -> str:
    """`the drive answered Write at LBA 99,840 (+512 blocks of 512 B): Write Fault (sct 0x2 /
    sc 0x80)`"""
    where = ""
    if found["lba"] is not None:
        count = f"+{found['blocks']:,} blocks" if found["blocks"] else "blocks"
        unit = f" of {found['lba_size']:,} B" if found["lba_size"] else ""
        where = f" at LBA {found['lba']:,} ({count}{unit})"
    return f"the drive answered {found['command'] or 'the I/O'}{where}: {found['status']}"
