"""How a checkpoint's ranks meet: a barrier before each timed phase, rank 0 gathering every
rank's record, and rank 0 telling every rank what it decided. torchrun's ranks, on one host or
several, meet in a torch.distributed (gloo) group (`TorchGroup`). qual's own ranks, forked
from one launcher process, meet through pipes the launcher made before forking them
(`ForkedGroup`), so that no rank needs torch: importing it was 1.6 s of a 4 s `ci`
checkpoint run. Every wait in either is bounded by the job's timeout."""

from __future__ import annotations

import errno
import os
import pickle
import select
import struct
import time
from datetime import timedelta

from qual.errors import QualError

_HEADER = struct.Struct("<Q")  # a message's length, before its pickled bytes


class PeerLost(QualError):
    """A rank's peer left the group, or did not answer within the timeout: the consequence of
    another rank's failure, which the launcher reports first where that rank said it."""


class TorchGroup:
    """A torch.distributed (gloo) group where torchrun's environment says (env://)."""

    def __init__(self, rank: int, world: int, timeout_s: float):
        import torch.distributed as dist

        self.dist, self.rank, self.world = dist, rank, world
        dist.init_process_group("gloo", rank=rank, world_size=world, init_method="env://",
                                timeout=timedelta(seconds=timeout_s))

    def barrier(self) -> None:
        self.dist.barrier()

    def gather(self, obj) -> list | None:
        out = [None] * self.world if self.rank == 0 else None
        self.dist.gather_object(obj, out, dst=0)
        return out

    def broadcast(self, obj):
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        self.dist.destroy_process_group()


class ForkedGroup:
    """Ranks forked from one process: rank 0 is the hub, with a pipe from every other rank
    (`up`) and one to it (`down`). The launcher makes the group before it forks the ranks;
    each rank calls `joined(rank)`, which keeps its own ends of the pipes and closes the rest,
    so that a rank that dies is an end of file to rank 0, not a wait; the launcher closes its
    copies once every rank is forked."""

    def __init__(self, world: int, timeout_s: float):
        self.world, self.timeout_s, self.rank = world, timeout_s, None
        self.up = [os.pipe() for _ in range(world)]  # rank r writes, rank 0 reads (r > 0)
        self.down = [os.pipe() for _ in range(world)]  # rank 0 writes, rank r reads (r > 0)
        self.open = {fd for pair in self.up[1:] + self.down[1:] for fd in pair}
        for pair in self.up[:1] + self.down[:1]:  # rank 0 talks to no pipe of its own
            for fd in pair:
                os.close(fd)

    def joined(self, rank: int) -> "ForkedGroup":
        """This process as rank `rank` (in the forked child)."""
        self.rank = rank
        if rank == 0:
            keep = {self.up[r][0] for r in range(1, self.world)} | \
                {self.down[r][1] for r in range(1, self.world)}
        else:
            keep = {self.up[rank][1], self.down[rank][0]}
        for fd in self.open - keep:
            os.close(fd)
        self.open = keep
        for fd in keep:
            os.set_blocking(fd, False)  # every wait goes through poll, with its bound
        return self

    def close(self) -> None:
        for fd in self.open:
            os.close(fd)
        self.open = set()

    def barrier(self) -> None:
        self.gather(None)
        self.broadcast(None)

    def gather(self, obj) -> list | None:
        if self.rank != 0:
            self._send(self.up[self.rank][1], obj, 0)
            return None
        deadline = time.monotonic() + self.timeout_s
        return [obj] + [self._receive(self.up[r][0], r, deadline) for r in range(1, self.world)]

    def broadcast(self, obj):
        if self.rank != 0:
            return self._receive(self.down[self.rank][0], 0, time.monotonic() + self.timeout_s)
        for r in range(1, self.world):
            self._send(self.down[r][1], obj, r)
        return obj

    def _wait(self, fd: int, peer: int, deadline: float, *, write: bool) -> None:
        # poll, not select: select cannot watch a descriptor above 1023
        poller = select.poll()
        poller.register(fd, select.POLLOUT if write else select.POLLIN)
        if not poller.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            raise PeerLost(errno.ETIMEDOUT, f"rank {self.rank} waited {self.timeout_s:g} s for "
                            f"rank {peer} of the checkpoint's ranks")

    def _send(self, fd: int, obj, peer: int) -> None:
        payload = pickle.dumps(obj)
        data = memoryview(_HEADER.pack(len(payload)) + payload)
        deadline = time.monotonic() + self.timeout_s
        while data:
            self._wait(fd, peer, deadline, write=True)
            try:
                data = data[os.write(fd, data):]
            except BlockingIOError:
                continue
            except BrokenPipeError as e:
                raise PeerLost(errno.EPIPE, f"rank {peer} left the checkpoint's ranks") from e

    def _receive(self, fd: int, peer: int, deadline: float):
        def read(n: int) -> bytes:
            out = bytearray()
            while len(out) < n:
                self._wait(fd, peer, deadline, write=False)
                try:
                    got = os.read(fd, n - len(out))
                except BlockingIOError:
                    continue
                if not got:
                    raise PeerLost(errno.EPIPE, f"rank {peer} left the checkpoint's ranks")
                out += got
            return bytes(out)
        (n,) = _HEADER.unpack(read(_HEADER.size))
        return pickle.loads(read(n))
