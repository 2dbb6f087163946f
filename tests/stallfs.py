"""A device that stalls, for real: a FUSE filesystem (spoken over /dev/fuse, no library) with
one file, `stall.dat`, as a drive that stops completing commands, and room for small files of
its own (qual's lock file beside a file target).

Run as root: `python3 stallfs.py MOUNTPOINT SIZE [ANSWER]`; it prints "ready" once mounted and
serves until killed (then pending requests fail with ENOTCONN).
- Without ANSWER, reads of `stall.dat` are never answered; everything else is.
- With ANSWER = N, it answers the first N requests (reads of `stall.dat` with zeros), then
  none at all: not a read, not a lookup, not a getattr, not an unlink, not a release — a
  storage server (or the drive under a file system) that stopped answering everything; it
  prints "stopped T" (T on time.monotonic()) when it does."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
import time

IN_HEADER = struct.Struct("<IIQQIIIHH")   # len, opcode, unique, nodeid, uid, gid, pid, ...
OUT_HEADER = struct.Struct("<IiQ")        # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # ino size blocks atime mtime ctime *nsec mode ...
READ_IN = struct.Struct("<QQII")           # fh, offset, size, read_flags (then more)
WRITE_IN = struct.Struct("<QQIIQII")       # fh, offset, size, write_flags, lock_owner, ...
SETATTR_IN = struct.Struct("<IIQQ")        # valid, padding, fh, size (then more)
LOOKUP, FORGET, GETATTR, SETATTR, UNLINK, OPEN, READ, WRITE, STATFS, RELEASE, FSYNC, \
    SETXATTR, GETXATTR, LISTXATTR, FLUSH, INIT, OPENDIR, RELEASEDIR, ACCESS, CREATE, \
    INTERRUPT, BATCH_FORGET = 1, 2, 3, 4, 10, 14, 15, 16, 17, 18, 20, 21, 22, 23, 25, 26, 27, \
    29, 34, 35, 36, 42
FATTR_SIZE = 1 << 3
FUSE_ASYNC_READ = 1
ROOT, FILE = 1, 2
NAME = b"stall.dat"


class Files:
    """The file system's state: stall.dat (read only, `size` bytes) and small files in memory."""

    def __init__(self, size: int):
        self.size = size
        self.names = {NAME: FILE}
        self.data: dict[int, bytearray] = {}
        self.next = FILE + 1

    def attr(self, node: int) -> bytes:
        if node == ROOT:
            return ATTR.pack(ROOT, 0, 0, 0, 0, 0, 0, 0, 0, 0o40755, 2, 0, 0, 0, 4096, 0)
        if node == FILE:
            return ATTR.pack(FILE, self.size, self.size // 512, 0, 0, 0, 0, 0, 0, 0o100644, 1,
                             0, 0, 0, 4096, 0)
        n = len(self.data[node])
        return ATTR.pack(node, n, -(-n // 512), 0, 0, 0, 0, 0, 0, 0o100644, 1, 0, 0, 0, 4096, 0)

    def entry(self, node: int) -> bytes:
        return struct.pack("<QQQQII", node, 0, 0, 0, 0, 0) + self.attr(node)


def answer(files: Files, opcode: int, node: int, body: bytes, stall_reads: bool):
    """(reply, error) for one request; None for no reply at all."""
    if opcode in (FORGET, BATCH_FORGET, INTERRUPT):
        return None
    if opcode == INIT:
        major, minor, readahead = struct.unpack_from("<III", body)
        # FUSE_ASYNC_READ: read-ahead is sent without waiting for it, as a block device's is,
        # so a submitter that may not block is not held up by it
        return struct.pack("<IIIIHHIIHHII6I", 7, 31, readahead, FUSE_ASYNC_READ, 16, 12,
                           1 << 17, 1, 32, 0, 0, 0, *([0] * 6)), 0
    name = body.split(b"\0", 1)[0]
    if opcode == LOOKUP:
        found = files.names.get(name) if node == ROOT else None
        return (files.entry(found), 0) if found else (b"", -errno.ENOENT)
    if opcode == GETATTR:
        return struct.pack("<QII", 0, 0, 0) + files.attr(node), 0
    if opcode == SETATTR:
        valid, _, _, size = SETATTR_IN.unpack_from(body)
        if valid & FATTR_SIZE and node in files.data:
            del files.data[node][size:]
            files.data[node].extend(bytes(size - len(files.data[node])))
        return struct.pack("<QII", 0, 0, 0) + files.attr(node), 0
    if opcode == CREATE and node == ROOT:
        name = body[16:].split(b"\0", 1)[0]
        files.names[name] = files.next
        files.data[files.next] = bytearray()
        files.next += 1
        return files.entry(files.names[name]) + struct.pack("<QII", 0, 0, 0), 0
    if opcode == UNLINK and node == ROOT and name in files.names and name != NAME:
        files.data.pop(files.names.pop(name), None)
        return b"", 0
    if opcode == READ:
        if node == FILE and stall_reads:
            return None  # no answer: a read is where the device stalls
        _, offset, size, _ = READ_IN.unpack_from(body)
        if node == FILE:
            return bytes(max(0, min(size, files.size - offset))), 0
        return bytes(files.data.get(node, b"")[offset:offset + size]), 0
    if opcode == WRITE and node in files.data:
        _, offset, size = WRITE_IN.unpack_from(body)[:3]
        payload = body[WRITE_IN.size:WRITE_IN.size + size]
        buf = files.data[node]
        buf.extend(bytes(max(0, offset + size - len(buf))))
        buf[offset:offset + size] = payload
        return struct.pack("<II", size, 0), 0
    if opcode == STATFS:  # blocks, bfree, bavail, files, ffree, bsize, namelen, frsize
        n = files.size // 4096
        return struct.pack("<QQQQQIIII6I", n * 2, n, n, 2, 0, 4096, 255, 4096, 0,
                           *([0] * 6)), 0
    if opcode in (OPEN, OPENDIR):
        # through the page cache, as a block device's reads are: a reader that may not block
        # (io_uring's first try) is told to come back, and a worker waits instead
        return struct.pack("<QIi", 0, 0, 0), 0
    if opcode in (RELEASE, RELEASEDIR, FLUSH, FSYNC, ACCESS):
        return b"", 0
    if opcode in (GETXATTR, LISTXATTR):
        return b"", -errno.ENODATA
    if opcode == SETXATTR:
        return b"", -errno.EOPNOTSUPP
    return b"", -errno.ENOSYS


def serve(fd: int, files: Files, answering: int | None) -> None:
    answered = 0
    while True:
        try:
            msg = os.read(fd, 1 << 21)
        except OSError as e:
            if e.errno in (errno.EINTR, errno.ENOENT):
                continue
            return  # unmounted
        length, opcode, unique, node = IN_HEADER.unpack_from(msg)[:4]
        if answering is not None and answered >= answering and opcode != INIT:
            if answered == answering:  # said once, on the monotonic clock all processes share
                print(f"stopped {time.monotonic()}", flush=True)
                answered += 1
            continue  # the server stopped answering anything
        got = answer(files, opcode, node, msg[IN_HEADER.size:length], answering is None)
        if got is None:
            continue
        out, err = got
        answered += 1
        os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(out), err, unique) + out)


def main() -> None:
    mountpoint, size = sys.argv[1], int(sys.argv[2])
    answering = int(sys.argv[3]) if len(sys.argv) > 3 else None
    fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"stallfs", mountpoint.encode(), b"fuse.stallfs", 6, options) != 0:  # nosuid,nodev
        sys.exit(f"mount: {os.strerror(ctypes.get_errno())}")
    print("ready", flush=True)
    serve(fd, Files(size), answering)


if __name__ == "__main__":
    main()
