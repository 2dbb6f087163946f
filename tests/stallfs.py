"""A device that stalls, for real: a FUSE filesystem (spoken over /dev/fuse, no library) with
one file, `stall.dat`, whose reads are never answered, as a drive that stops completing
commands. Run as root: `python3 stallfs.py MOUNTPOINT SIZE`; it prints "ready" once mounted
and serves until killed (then pending reads fail with ENOTCONN)."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

IN_HEADER = struct.Struct("<IIQQIIIHH")   # len, opcode, unique, nodeid, uid, gid, pid, ...
OUT_HEADER = struct.Struct("<IiQ")        # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # ino size blocks atime mtime ctime *nsec mode ...
LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE, FLUSH, INIT, OPENDIR, RELEASEDIR, \
    INTERRUPT, BATCH_FORGET = 1, 2, 3, 14, 15, 17, 18, 25, 26, 27, 29, 36, 42
FUSE_ASYNC_READ = 1
ROOT, FILE = 1, 2
NAME = b"stall.dat"


def attr(node: int, size: int) -> bytes:
    if node == ROOT:
        return ATTR.pack(ROOT, 0, 0, 0, 0, 0, 0, 0, 0, 0o40755, 2, 0, 0, 0, 4096, 0)
    return ATTR.pack(FILE, size, size // 512, 0, 0, 0, 0, 0, 0, 0o100644, 1, 0, 0, 0, 4096, 0)


def serve(fd: int, size: int) -> None:
    while True:
        try:
            msg = os.read(fd, 1 << 20)
        except OSError as e:
            if e.errno in (errno.EINTR, errno.ENOENT):
                continue
            return  # unmounted
        length, opcode, unique, node = IN_HEADER.unpack_from(msg)[:4]
        body = msg[IN_HEADER.size:length]
        out, err = b"", 0
        if opcode in (FORGET, BATCH_FORGET, INTERRUPT, READ):
            continue  # no answer: a read is where the device stalls
        if opcode == INIT:
            major, minor, readahead = struct.unpack_from("<III", body)
            # FUSE_ASYNC_READ: read-ahead is sent without waiting for it, as a block device's
            # is, so a submitter that may not block is not held up by it
            out = struct.pack("<IIIIHHIIHHII6I", 7, 31, readahead, FUSE_ASYNC_READ, 16, 12,
                              1 << 17, 1, 32, 0, 0, 0, *([0] * 6))
        elif opcode == LOOKUP and node == ROOT and body.rstrip(b"\0") == NAME:
            out = struct.pack("<QQQQII", FILE, 0, 3600, 3600, 0, 0) + attr(FILE, size)
        elif opcode == LOOKUP:
            err = -errno.ENOENT
        elif opcode == GETATTR:
            out = struct.pack("<QII", 3600, 0, 0) + attr(node, size)
        elif opcode == STATFS:  # blocks, bfree, bavail, files, ffree, bsize, namelen, frsize
            out = struct.pack("<QQQQQIIII6I", size // 4096 * 2, size // 4096, size // 4096, 2, 0,
                              4096, 255, 4096, 0, *([0] * 6))
        elif opcode in (OPEN, OPENDIR):
            # through the page cache, as a block device's reads are: a reader that may not
            # block (io_uring's first try) is told to come back, and a worker waits instead
            out = struct.pack("<QIi", 0, 0, 0)
        elif opcode not in (RELEASE, RELEASEDIR, FLUSH):
            err = -errno.ENOSYS
        os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(out), err, unique) + out)


def main() -> None:
    mountpoint, size = sys.argv[1], int(sys.argv[2])
    fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"stallfs", mountpoint.encode(), b"fuse.stallfs", 6, options) != 0:  # nosuid,nodev
        sys.exit(f"mount: {os.strerror(ctypes.get_errno())}")
    print("ready", flush=True)
    serve(fd, size)


if __name__ == "__main__":
    main()
