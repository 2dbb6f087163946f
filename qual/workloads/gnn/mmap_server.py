"""The mmap baseline's gather server: a small process (numpy only, so that what it costs
besides the page cache stays small) that fancy-indexes the memory-mapped feature store into
shared memory, inside the memory cgroup that holds the baseline to its budget.

A request on stdin is n (little-endian int64: n rows are waiting in the rows buffer) or -cap
followed by the 64-byte names of new rows and output buffers; it answers "ok" once the rows
are in the output buffer.

    python -m qual.workloads.gnn.mmap_server STORE ROWS ROW_STRIDE ROW_BYTES DIM
"""

import mmap
import struct
import sys
from multiprocessing import resource_tracker, shared_memory

import numpy as np


def serve(path: str, rows: int, stride: int, row_bytes: int, dim: int) -> None:
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=(rows, stride))
    # Row gathers are random: readahead would fill the budget with pages nobody asked for and
    # make the cgroup reclaim them again at every fault
    mapped._mmap.madvise(mmap.MADV_RANDOM)
    store = mapped[:, :row_bytes].view(np.float32)
    shm_rows = shm_out = None
    sys.stdout.buffer.write(b"ready\n")
    sys.stdout.buffer.flush()
    while head := sys.stdin.buffer.read(8):
        (n,) = struct.unpack("<q", head)
        if n < 0:
            names = sys.stdin.buffer.read(128)
            for shm in (shm_rows, shm_out):
                if shm is not None:
                    shm.close()
            shm_rows = _attach(names[:64].decode().strip())
            shm_out = _attach(names[64:].decode().strip())
            continue
        want = np.ndarray((n,), dtype=np.int64, buffer=shm_rows.buf)
        out = np.ndarray((n, dim), dtype=np.float32, buffer=shm_out.buf)
        # mode="clip" writes straight into `out`; the default mode buffers the whole result,
        # an allocation the cgroup would have to hold (the rows were checked by the client)
        np.take(store, want, axis=0, out=out, mode="clip")
        sys.stdout.buffer.write(b"ok\n")
        sys.stdout.buffer.flush()


def _attach(name: str) -> shared_memory.SharedMemory:
    shm = shared_memory.SharedMemory(name=name)
    # the client made it and unlinks it: this process's tracker must not
    resource_tracker.unregister(shm._name, "shared_memory")
    return shm


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
