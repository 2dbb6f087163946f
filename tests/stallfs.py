"""Storage that misbehaves, for real: a FUSE filesystem (spoken over /dev/fuse, no library) that
passes every request through to a backing folder, and misbehaves as it is told — as a drive (or
the server under a network or object-store mount) does when it fails:

- `--stall-reads NAME`: reads of NAME are never answered (a drive that stops completing reads);
  everything else is;
- `--answer N`: after N answered requests, nothing more is answered at all — not a read, a
  lookup, a getattr, an unlink or a release: a storage that stopped answering everything.
  `--stop-on OP:TEXT` does the same from the first request OP on a path holding TEXT (that one
  unanswered: `WRITE:rank-`), and SIGUSR1 at a moment of the caller's choosing. It prints
  "stopped T" (T on time.monotonic(), one clock for every process) when it stops;
- `--eio NAME:OFFSET:LENGTH`: reads of NAME that touch [OFFSET, OFFSET+LENGTH) fail with EIO (an
  unreadable range: the medium error a drive returns), writes succeed;
- `--fsync-delay S`: every fsync/fdatasync of a file takes S seconds longer (a drive whose cache
  flush is slow), so a timing that includes the flush shows it;
- `--read-delay S`: every read of a file takes S seconds longer (a slow drive), so a reader
  is still reading, answered, a known time later;
- `--log PATH`: one line per request ("OPCODE path errno"; a rename's path is "old -> new"), flushed as it is answered, for tests that
  check the order in which a writer made things durable.

Run as root: `python3 stallfs.py MOUNTPOINT BACKING [options]`; it prints "ready" once mounted and
serves until killed (then pending requests fail with ENOTCONN). `--size N` creates
BACKING/stall.dat of N bytes (allocated, zeros) first."""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import signal
import stat
import struct
import sys
import time

IN_HEADER = struct.Struct("<IIQQIIII")     # len, opcode, unique, nodeid, uid, gid, pid, pad
OUT_HEADER = struct.Struct("<IiQ")         # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # ino size blocks a/m/ctime a/m/ctime nsec mode ...
READ_IN = struct.Struct("<QQII")           # fh, offset, size, read_flags (then more)
WRITE_IN = struct.Struct("<QQIIQII")       # fh, offset, size, write_flags, lock_owner, ...
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")  # valid, pad, fh, size, lock_owner, a/m/ctime,
#                                                  a/m/ctime nsec, mode, pad, uid, gid, pad
OPCODES = {1: "LOOKUP", 2: "FORGET", 3: "GETATTR", 4: "SETATTR", 9: "MKDIR", 10: "UNLINK",
           11: "RMDIR", 12: "RENAME", 14: "OPEN", 15: "READ", 16: "WRITE", 17: "STATFS",
           18: "RELEASE", 20: "FSYNC", 21: "SETXATTR", 22: "GETXATTR", 23: "LISTXATTR",
           24: "REMOVEXATTR", 25: "FLUSH", 26: "INIT", 27: "OPENDIR", 28: "READDIR",
           29: "RELEASEDIR", 30: "FSYNCDIR", 34: "ACCESS", 35: "CREATE", 36: "INTERRUPT",
           42: "BATCH_FORGET", 43: "FALLOCATE"}
NO_REPLY = {"FORGET", "BATCH_FORGET", "INTERRUPT"}
FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE, FATTR_ATIME, FATTR_MTIME = 1, 2, 4, 8, 16, 32
FATTR_ATIME_NOW, FATTR_MTIME_NOW = 128, 256
# read-ahead sent without waiting (as a block device's), writes of more than a page, max_pages
FUSE_ASYNC_READ, FUSE_BIG_WRITES, FUSE_MAX_PAGES = 1, 1 << 5, 1 << 22
ROOT = 1


class Reply(Exception):
    def __init__(self, err: int):
        self.err = err


class Passthrough:
    """Every request answered from the backing folder; nodes are paths inside it."""

    def __init__(self, backing: str, args):
        self.backing = backing
        self.paths = {ROOT: ""}
        self.nodes = {"": ROOT}
        self.files: dict[int, int] = {}  # fh -> backing descriptor (files and folders)
        self.next_fh = 1
        self.stall_reads = args.stall_reads
        self.eio = [(name, int(off), int(n)) for name, off, n in
                    (spec.split(":") for spec in args.eio)]
        self.fsync_delay = args.fsync_delay
        self.read_delay = args.read_delay

    def real(self, node: int, name: bytes = b"") -> str:
        rel = self.paths[node]
        if name:
            rel = f"{rel}/{name.decode()}" if rel else name.decode()
        return os.path.join(self.backing, rel)

    def rel(self, node: int, name: bytes) -> str:
        rel = self.paths[node]
        return f"{rel}/{name.decode()}" if rel else name.decode()

    def node(self, rel: str) -> int:
        if rel not in self.nodes:
            self.nodes[rel] = len(self.paths) + 1
            while self.nodes[rel] in self.paths:
                self.nodes[rel] += 1
            self.paths[self.nodes[rel]] = rel
        return self.nodes[rel]

    @staticmethod
    def attr(st: os.stat_result, node: int) -> bytes:
        return ATTR.pack(node, st.st_size, st.st_blocks, int(st.st_atime), int(st.st_mtime),
                         int(st.st_ctime), st.st_atime_ns % 10**9, st.st_mtime_ns % 10**9,
                         st.st_ctime_ns % 10**9, st.st_mode, st.st_nlink, st.st_uid, st.st_gid,
                         st.st_rdev & 0xFFFFFFFF, 4096, 0)

    def entry(self, rel: str) -> bytes:
        st = os.lstat(os.path.join(self.backing, rel))  # ENOENT before a node is made for it
        node = self.node(rel)
        return struct.pack("<QQQQII", node, 0, 0, 0, 0, 0) + self.attr(st, node)

    def opened(self, fd: int) -> bytes:
        fh, self.next_fh = self.next_fh, self.next_fh + 1
        self.files[fh] = fd
        return struct.pack("<QII", fh, 0, 0)

    def hits_eio(self, node: int, offset: int, size: int) -> bool:
        return any(self.paths[node] == name and offset < off + n and off < offset + size
                   for name, off, n in self.eio)

    def answer(self, op: str, node: int, body: bytes) -> bytes | None:
        """The reply's body; raises Reply(-errno) for an error; None for no reply at all."""
        if op in NO_REPLY:
            return None
        if op == "INIT":
            major, minor, readahead = struct.unpack_from("<III", body)
            return struct.pack("<IIIIHHIIHHII6I", 7, 31, readahead,
                               FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_MAX_PAGES, 16, 12,
                               1 << 20, 1, 256, 0, 0, 0, *([0] * 6))
        name = body.split(b"\0", 1)[0]
        if op == "LOOKUP":
            return self.entry(self.rel(node, name))
        if op == "GETATTR":
            return struct.pack("<QII", 0, 0, 0) + self.attr(os.lstat(self.real(node)), node)
        if op == "SETATTR":
            (valid, _, fh, size, _, atime, mtime, _, atime_ns, mtime_ns, _, mode, _, uid, gid,
             _) = SETATTR_IN.unpack_from(body)
            path = self.real(node)
            if valid & FATTR_SIZE:
                os.truncate(path, size)
            if valid & FATTR_MODE:
                os.chmod(path, stat.S_IMODE(mode))
            if valid & (FATTR_UID | FATTR_GID):
                os.chown(path, uid if valid & FATTR_UID else -1, gid if valid & FATTR_GID else -1)
            if valid & (FATTR_ATIME | FATTR_MTIME):
                st, now = os.lstat(path), time.time_ns()
                a = now if valid & FATTR_ATIME_NOW else atime * 10**9 + atime_ns \
                    if valid & FATTR_ATIME else st.st_atime_ns
                m = now if valid & FATTR_MTIME_NOW else mtime * 10**9 + mtime_ns \
                    if valid & FATTR_MTIME else st.st_mtime_ns
                os.utime(path, ns=(a, m))
            return struct.pack("<QII", 0, 0, 0) + self.attr(os.lstat(path), node)
        if op == "MKDIR":
            mode, umask = struct.unpack_from("<II", body)
            name = body[8:].split(b"\0", 1)[0]
            os.mkdir(self.real(node, name), mode & ~umask)
            return self.entry(self.rel(node, name))
        if op in ("UNLINK", "RMDIR"):
            (os.unlink if op == "UNLINK" else os.rmdir)(self.real(node, name))
            return b""
        if op == "RENAME":
            (newdir,) = struct.unpack_from("<Q", body)
            old, new = body[8:].split(b"\0")[:2]
            src, dst = self.rel(node, old), self.rel(newdir, new)
            os.rename(self.real(node, old), self.real(newdir, new))
            for n, rel in list(self.paths.items()):  # the node and everything under it move
                if rel == src or rel.startswith(src + "/"):
                    moved = dst + rel[len(src):]
                    self.nodes.pop(rel, None)
                    self.nodes[moved], self.paths[n] = n, moved
            return b""
        if op in ("OPEN", "OPENDIR"):
            (flags,) = struct.unpack_from("<I", body)
            if op == "OPENDIR":
                return self.opened(os.open(self.real(node), os.O_RDONLY | os.O_DIRECTORY))
            return self.opened(os.open(self.real(node), flags & ~(os.O_DIRECT | os.O_CREAT |
                                                                   os.O_EXCL | os.O_TRUNC)))
        if op == "CREATE":
            flags, mode, umask, _ = struct.unpack_from("<IIII", body)
            name = body[16:].split(b"\0", 1)[0]
            fd = os.open(self.real(node, name), (flags & ~os.O_DIRECT) | os.O_CREAT,
                         mode & ~umask)
            return self.entry(self.rel(node, name)) + self.opened(fd)
        if op == "READ":
            fh, offset, size, _ = READ_IN.unpack_from(body)
            if self.paths[node] == self.stall_reads:
                return None  # no answer: a read is where the drive stalls
            if self.hits_eio(node, offset, size):
                raise Reply(-errno.EIO)
            time.sleep(self.read_delay)
            return os.pread(self.files[fh], size, offset)
        if op == "WRITE":
            fh, offset, size = WRITE_IN.unpack_from(body)[:3]
            done = os.pwrite(self.files[fh], body[WRITE_IN.size:WRITE_IN.size + size], offset)
            return struct.pack("<II", done, 0)
        if op == "FALLOCATE":
            fh, offset, length, mode = struct.unpack_from("<QQQI", body)
            if mode:
                raise Reply(-errno.EOPNOTSUPP)
            os.posix_fallocate(self.files[fh], offset, length)
            return b""
        if op == "READDIR":
            fh, offset, size, _ = READ_IN.unpack_from(body)
            names = sorted(os.listdir(self.real(node)))
            out = b""
            for i, entry in enumerate(names[offset:], start=offset + 1):
                raw = entry.encode()
                st = os.lstat(os.path.join(self.real(node), entry))
                dirent = struct.pack("<QQII", st.st_ino, i, len(raw), stat.S_IFMT(st.st_mode) >> 12)
                dirent += raw + b"\0" * (-len(raw) % 8)
                if len(out) + len(dirent) > size:
                    break
                out += dirent
            return out
        if op == "STATFS":
            v = os.statvfs(self.backing)
            return struct.pack("<QQQQQIIII6I", v.f_blocks, v.f_bfree, v.f_bavail, v.f_files,
                               v.f_ffree, v.f_bsize, v.f_namemax, v.f_frsize, 0, *([0] * 6))
        if op == "FSYNC":
            fh, flags = struct.unpack_from("<QI", body)
            time.sleep(self.fsync_delay)
            (os.fdatasync if flags & 1 else os.fsync)(self.files[fh])
            return b""
        if op == "FSYNCDIR":
            fh, _ = struct.unpack_from("<QI", body)
            os.fsync(self.files[fh])
            return b""
        if op in ("RELEASE", "RELEASEDIR"):
            (fh,) = struct.unpack_from("<Q", body)
            os.close(self.files.pop(fh))
            return b""
        if op in ("FLUSH", "ACCESS"):
            return b""
        if op == "SETXATTR":
            size, flags = struct.unpack_from("<II", body)
            key, rest = body[8:].split(b"\0", 1)
            os.setxattr(self.real(node), key, rest[:size], flags)
            return b""
        if op in ("GETXATTR", "LISTXATTR"):
            (size,) = struct.unpack_from("<I", body)
            value = os.getxattr(self.real(node), body[8:].split(b"\0", 1)[0],
                                follow_symlinks=False) if op == "GETXATTR" else \
                b"".join(k.encode() + b"\0" for k in os.listxattr(self.real(node)))
            if size == 0:
                return struct.pack("<II", len(value), 0)
            if len(value) > size:
                raise Reply(-errno.ERANGE)
            return value
        if op == "REMOVEXATTR":
            os.removexattr(self.real(node), name)
            return b""
        raise Reply(-errno.ENOSYS)


class Server:
    def __init__(self, fd: int, fs: Passthrough, answering: int | None, stop_on: str | None,
                 log):
        self.fd, self.fs, self.log = fd, fs, log
        self.answering = answering
        self.stop_on = stop_on.split(":", 1) if stop_on else None
        self.answered = 0
        self.stopped = False

    def stop(self, *_) -> None:
        if not self.stopped:
            self.stopped = True
            print(f"stopped {time.monotonic()}", flush=True)  # one clock for every process

    def serve(self) -> None:
        while True:
            try:
                msg = os.read(self.fd, 1 << 21)
            except OSError as e:
                if e.errno in (errno.EINTR, errno.ENOENT):
                    continue
                return  # unmounted
            length, opcode, unique, node = IN_HEADER.unpack_from(msg)[:4]
            op = OPCODES.get(opcode, str(opcode))
            if self.answering is not None and self.answered >= self.answering and op != "INIT":
                self.stop()
            if self.stop_on and op == self.stop_on[0] and \
                    self.stop_on[1] in self.fs.paths.get(node, ""):
                self.stop()
            if self.stopped:
                continue  # the storage stopped answering anything
            body = msg[IN_HEADER.size:length]
            try:
                out, err = self.fs.answer(op, node, body), 0
            except Reply as r:
                out, err = b"", r.err
            except OSError as e:
                out, err = b"", -(e.errno or errno.EIO)
            if out is None:
                continue
            if self.log:
                where = self.fs.paths.get(node, "?")
                if op in ("LOOKUP", "UNLINK", "RMDIR"):
                    where = self.fs.rel(node, body.split(b"\0", 1)[0])
                elif op == "RENAME":  # "old -> new", each a path from the root
                    (newdir,) = struct.unpack_from("<Q", body)
                    old, new = body[8:].split(b"\0")[:2]
                    where = f"{self.fs.rel(node, old)} -> {self.fs.rel(newdir, new)}"
                self.log.write(f"{op} {where} {err}\n")
                self.log.flush()
            self.answered += 1
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(out), err, unique) + out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mountpoint")
    p.add_argument("backing")
    p.add_argument("--size", type=int, help="create BACKING/stall.dat of this many bytes")
    p.add_argument("--stall-reads", metavar="NAME")
    p.add_argument("--answer", type=int, metavar="N")
    p.add_argument("--stop-on", metavar="OP:TEXT")
    p.add_argument("--eio", action="append", default=[], metavar="NAME:OFFSET:LENGTH")
    p.add_argument("--fsync-delay", type=float, default=0.0)
    p.add_argument("--read-delay", type=float, default=0.0)
    p.add_argument("--log")
    args = p.parse_args()
    if args.size is not None:
        with open(os.path.join(args.backing, "stall.dat"), "wb") as f:
            os.posix_fallocate(f.fileno(), 0, args.size)  # allocated: a sparse file is refused
    fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"stallfs", args.mountpoint.encode(), b"fuse.stallfs", 6, options) != 0:
        sys.exit(f"mount: {os.strerror(ctypes.get_errno())}")  # 6: nosuid, nodev
    server = Server(fd, Passthrough(args.backing, args), args.answer, args.stop_on,
                    open(args.log, "a") if args.log else None)
    signal.signal(signal.SIGUSR1, server.stop)
    print("ready", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
