"""The QualError family: every failure qual reports, with errno, operation, offset and target.

An engine or target error is never an AssertionError: in a qualification report it is
*broken* (the run could not measure), distinct from a threshold *failed*. This module imports
nothing of qual's, so every layer can raise these."""

from __future__ import annotations

import errno as errno_mod


def errno_name(err: int) -> str:
    """EIO for 5: the name the kernel's headers give an errno."""
    return errno_mod.errorcode.get(err, str(err))


class QualError(Exception):
    """An engine or target failure: errno, what was being done, where, and on what."""

    def __init__(self, errno: int, message: str, *, op: str | None = None,
                 offset: int | None = None, target: str | None = None):
        self.errno = errno
        self.message = message
        self.op = op
        self.offset = offset
        self.target = target
        super().__init__(str(self))

    def __str__(self) -> str:
        where = []
        if self.target:
            where.append(str(self.target))
        if self.op:
            where.append(self.op if self.offset is None else f"{self.op} at offset {self.offset}")
        name = errno_name(self.errno)
        prefix = ": ".join(where)
        return f"{prefix}: {self.message} [{name}]" if prefix else f"{self.message} [{name}]"

    def __reduce__(self):  # keeps the fields when pytest-xdist or multiprocessing pickles it
        return (_rebuild_error, (type(self), self.errno, self.message, self.op, self.offset,
                                 self.target))


def _rebuild_error(cls, errno, message, op, offset, target):
    return cls(errno, message, op=op, offset=offset, target=target)


class InvalidJob(QualError):
    """Job parameters the engine cannot run (raised before any I/O)."""


class TargetUnavailable(QualError):
    """The target cannot be opened or used: missing, no permission, busy, read-only."""


class DeviceIoError(QualError):
    """The device failed an I/O, or returned less than asked."""


class Stalled(DeviceIoError):
    """An I/O stayed outstanding past the command timeout: the device stopped answering."""


class DataMismatch(DeviceIoError):
    """Data read back is not what was written there."""


class NoSpace(QualError):
    """The target ran out of space."""


class BackendUnavailable(QualError):
    """The requested I/O backend cannot be used on this machine."""


class Refused(QualError):
    """The run as asked cannot give a figure worth having (a KV store too small for what its
    users hold at once): refused before any I/O, saying why and what would do."""


class NotApplicable(Refused):
    """The run does not apply to this target (a power cut where nothing can cut the power):
    refused before any I/O, saying why."""


class Cancelled(QualError):
    """The job was cancelled before it finished."""


class EngineStuck(QualError):
    """A cancelled engine call did not stop: the kernel has not returned its I/Os."""


_ERROR_CLASS = {
    errno_mod.EINVAL: InvalidJob,
    errno_mod.ENOENT: TargetUnavailable,
    errno_mod.ENODEV: TargetUnavailable,
    errno_mod.ENXIO: TargetUnavailable,
    errno_mod.EACCES: TargetUnavailable,
    errno_mod.EPERM: TargetUnavailable,
    errno_mod.EBUSY: TargetUnavailable,
    errno_mod.EROFS: TargetUnavailable,
    errno_mod.ENOTSUP: TargetUnavailable,
    errno_mod.EIO: DeviceIoError,
    errno_mod.ENODATA: DeviceIoError,
    errno_mod.EBADMSG: DataMismatch,
    errno_mod.ETIMEDOUT: Stalled,
    errno_mod.ENOSPC: NoSpace,
    errno_mod.EDQUOT: NoSpace,
    errno_mod.ENOSYS: BackendUnavailable,
    errno_mod.ECANCELED: Cancelled,
}


def error_for(err: int) -> type[QualError]:
    return _ERROR_CLASS.get(err, QualError)


class ImplausibleMeasurement(QualError):
    """A result the hardware cannot have produced, or that the data cannot support."""
