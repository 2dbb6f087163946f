"""Scratch files qual owns: created with O_EXCL, proved to be qual's on an open descriptor
(never through a link), marked, and the only files qual writes or removes on a file target.

The proof cannot be forged by writing a file beside the scratch file: the marker names the
inode (device, number, generation) and a random token, and the scratch file carries the same
token in an extended attribute that only its owner can set. A proven file is a regular file
owned by this user; a link, a device node or another user's file never is."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hmac
import json
import os
import shutil
import secrets
import stat
import struct
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from qual.errors import TargetUnavailable

TOKEN_XATTR = "user.qual.scratch"
FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long): the inode's generation number
MARKER_MAX = 1 << 16  # bytes: a marker is a few hundred


@dataclass(frozen=True)
class Scratch:
    """A scratch file proved to be qual's, and how much of it holds written data."""

    path: Path
    dev: int
    ino: int
    generation: int | None
    token: str
    written: int

    @property
    def inode(self) -> tuple[int, int]:
        return self.dev, self.ino


def marker_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.qual.json")


def open_nofollow(path: Path, flags: int = os.O_RDONLY) -> int:
    """Open without following a final link, and without blocking on a FIFO planted there."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)


def _generation(fd: int) -> int | None:
    """The inode's generation (ext4, xfs, btrfs): a new file that reuses a deleted one's inode
    number gets a new one. None where the filesystem has none."""
    try:
        return struct.unpack("l", fcntl.ioctl(fd, FS_IOC_GETVERSION, bytes(8)))[0]
    except OSError:
        return None


def _read_marker(path: Path) -> dict | None:
    try:
        fd = open_nofollow(marker_path(path))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        doc = json.loads(os.read(fd, MARKER_MAX))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return doc if isinstance(doc, dict) and doc.get("created_by") == "qual" else None


def prove(path: Path) -> Scratch | None:
    """The scratch file at `path` if qual provably created it, else None: a regular file (not
    a link, not a device node), owned by this user, the inode its marker names, carrying the
    marker's token. Every check is made on one descriptor, opened without following links."""
    marker = _read_marker(path)
    if marker is None:
        return None
    try:
        fd = open_nofollow(path)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        generation = _generation(fd)
        if (marker.get("dev"), marker.get("inode"), marker.get("generation")) != \
                (st.st_dev, st.st_ino, generation):
            return None
        token = os.getxattr(fd, TOKEN_XATTR).decode()
        if not hmac.compare_digest(token, str(marker.get("token"))):
            return None
        return Scratch(path, st.st_dev, st.st_ino, generation, token, int(marker["written"]))
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def create(path: Path) -> Scratch:
    """Create an empty scratch file at `path` (never over an existing entry, never through a
    link), sign it with a fresh token and mark it. Where the filesystem links unnamed files in
    (O_TMPFILE: ext4, xfs, btrfs, tmpfs) it is made, signed and marked unnamed, then linked at
    its name, so a run killed at any moment leaves no file or one qual can prove is its own;
    elsewhere (overlayfs, FUSE) it is named first."""
    try:
        fd = os.open(path.parent, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno not in UNNAMED_UNSUPPORTED:
            raise TargetUnavailable(e.errno, f"cannot create qual's scratch file: {e.strerror}",
                                    target=str(path)) from None
        return _create_named(path)
    try:
        scratch = _sign(fd, path, named=False)
        try:  # a link never replaces an entry, nor follows a link at the new name
            _link_in(fd, path)
        except OSError as e:
            if e.errno in UNNAMED_UNSUPPORTED:
                return _create_named(path)  # the unnamed file goes with its descriptor
            raise TargetUnavailable(e.errno, f"cannot create qual's scratch file: {e.strerror}",
                                    target=str(path)) from None
        fsync_dir(path.parent)
        return scratch
    finally:
        os.close(fd)


UNNAMED_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.EXDEV)
_AT_FDCWD, _AT_SYMLINK_FOLLOW = -100, 0x400


def _link_in(fd: int, path: Path) -> None:
    """linkat(2) of an unnamed file's descriptor to `path` (through /proc/self/fd, followed:
    Python's os.link would link the /proc entry itself)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.linkat(_AT_FDCWD, f"/proc/self/fd/{fd}".encode(), _AT_FDCWD,
                   os.fsencode(path), _AT_SYMLINK_FOLLOW) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _create_named(path: Path) -> Scratch:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except OSError as e:
        raise TargetUnavailable(e.errno, f"cannot create qual's scratch file: {e.strerror}",
                                target=str(path)) from None
    try:
        return _sign(fd, path, named=True)
    finally:
        os.close(fd)


def _sign(fd: int, path: Path, *, named: bool) -> Scratch:
    """Give the new file a fresh token (its xattr) and mark it as qual's at `path`."""
    st = os.fstat(fd)
    token = secrets.token_hex(16)
    try:
        os.setxattr(fd, TOKEN_XATTR, token.encode())
    except OSError as e:
        if named:
            _unlink_if(path, (st.st_dev, st.st_ino))
        raise TargetUnavailable(e.errno, "the filesystem keeps no extended attributes "
                                f"({e.strerror}), so qual could not prove later that it "
                                "created its scratch file here", target=str(path)) from None
    return mark(Scratch(path, st.st_dev, st.st_ino, _generation(fd), token, 0), 0)


def mark(scratch: Scratch, written: int) -> Scratch:
    """Record that [0, written) of the scratch file holds data (atomically, durably)."""
    doc = {"created_by": "qual", "dev": scratch.dev, "inode": scratch.ino,
           "generation": scratch.generation, "token": scratch.token, "written": written,
           "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    folder = scratch.path.parent
    # mkstemp: a new file (O_EXCL, mode 0600), so a link planted at a fixed name is never used
    fd, tmp = tempfile.mkstemp(prefix=f".{scratch.path.name}.", suffix=".qual.tmp", dir=folder)
    try:
        os.write(fd, json.dumps(doc).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, marker_path(scratch.path))  # a rename replaces a link, never follows it
    fsync_dir(folder)
    return replace(scratch, written=written)


def remove(scratch: Scratch) -> None:
    """Remove a proven scratch file and its marker."""
    _unlink_if(scratch.path, scratch.inode)
    marker_path(scratch.path).unlink(missing_ok=True)  # unlink never follows a link


def _unlink_if(path: Path, inode: tuple[int, int]) -> None:
    """Unlink `path` if it is still that inode (not an entry swapped in since)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if (st.st_dev, st.st_ino) == inode:
        path.unlink()


def check_regular(path: Path, what: str) -> os.stat_result:
    """The status of a file qual did not create but may read: a regular file reached without
    following a final link. A link, a device node or a FIFO is refused."""
    try:
        fd = open_nofollow(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise TargetUnavailable(errno.EPERM, f"is a symbolic link; name the {what} itself",
                                    target=str(path)) from None
        raise TargetUnavailable(e.errno, f"cannot open: {e.strerror}", target=str(path)) from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise TargetUnavailable(errno.EPERM, "is not a regular file; a block device is a "
                                "target only when named as one", target=str(path))
    return st


def own_tempdir(kind: str, *, whole: bool = True) -> Path:
    """A new folder of this process's in the temporary folder (`qual-KIND-PID-…`), after
    removing those of its kind whose process died without removing its own (a kill -9 runs no
    clean-up): only this user's folders named so, and only when no process has that pid
    any more. `whole`: they go with what they hold; otherwise only an empty one goes (a mount
    point, which a live mount would never leave empty)."""
    root = Path(tempfile.gettempdir())
    for old in root.glob(f"qual-{kind}-*-*"):
        pid = old.name[len(f"qual-{kind}-"):].split("-")[0]
        try:
            if not pid.isdigit() or os.lstat(old).st_uid != os.geteuid() or _alive(int(pid)):
                continue
            shutil.rmtree(old) if whole else old.rmdir()
        except OSError:
            continue  # gone meanwhile, or not empty: left as it is
    return Path(tempfile.mkdtemp(prefix=f"qual-{kind}-{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def own_folder(path: Path) -> Path:
    """A folder of qual's inside a target (checkpoints, datasets, stores): made here, or one
    made before that is still a real directory (not a link), owned by this user and writable
    by no one else, so that nobody can plant a link where qual will create a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o755)
    except FileExistsError:
        pass
    except OSError as e:
        raise TargetUnavailable(e.errno, f"cannot make qual's folder: {e.strerror}",
                                target=str(path)) from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise TargetUnavailable(errno.EPERM, "is not a folder qual can trust: it must be a real "
                                "directory (not a link), owned by the user running qual and "
                                "writable by no one else", target=str(path))
    return path


def made_by_qual(manifest: Path) -> bool:
    """Whether a folder's manifest (JSON, written by qual when it made the folder) says so."""
    try:
        return json.loads(manifest.read_text()).get("created_by") == "qual"
    except (OSError, ValueError, AttributeError):
        return False


def remove_made(root: Path, manifest: str) -> None:
    """Remove only what qual made under `root`: each folder whose `manifest` file says qual
    made it; then `root` itself if that left it empty. Anything else stays."""
    if not root.is_dir() or root.is_symlink():
        return
    for d in root.iterdir():
        if d.is_dir() and not d.is_symlink() and made_by_qual(d / manifest):
            shutil.rmtree(d)
    try:
        root.rmdir()
    except OSError:
        pass  # not empty: someone else's files are there


def drop_cache(path: str | Path) -> None:
    """Evict a file's clean pages from the page cache, so the next read comes from the
    device (written pages must be made durable first: dirty pages are not evicted)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the entries of a folder durable (files created, renamed or removed in it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
