/* engine.h — internal plumbing shared by the engine's source files (not part of the API). */
#ifndef QUAL_ENGINE_H
#define QUAL_ENGINE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <time.h>

#include "qual.h"

/* ---- errors (error.c) */
int qual_set_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- clock */
static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- open a target's path with flags; with an expected inode, without following a final
 * link and only if fstat on the descriptor shows it (target.c). op names the use in errors. */
int target_open(const char *path, int flags, const struct qual_inode *expect, const char *op,
                int *fd_out);

/* ---- the backend to use for one asked for (auto: io_uring where it works, else psync),
 * and the whole process's user and system CPU seconds so far (ioq.c) */
int resolve_backend(int requested, int *chosen);
void process_cpu(double *user, double *sys);

/* ---- memory I/O lands in (memory.c): fresh, zeroed, aligned to `align` (at least a page;
 * 2 MiB with huge pages from 2 MiB up) and faulted in; NULL when there is none */
void *io_memory_alloc(size_t len, size_t align);
void io_memory_free(void *mem, size_t len);

/* ---- PRNG (pattern.c): xoshiro256** seeded through splitmix64 */
struct rng {
    uint64_t s[4];
};
void rng_seed(struct rng *r, uint64_t seed);
uint64_t rng_next(struct rng *r);
uint64_t rng_below(struct rng *r, uint64_t n); /* uniform in [0, n), n > 0 */
uint64_t mix64(uint64_t x);                    /* splitmix64 finaliser */

/* Make a buffer of random bytes unique for this write: the offset and a sequence number go
 * into the first 16 bytes of every 4 KiB (or 512 B when smaller), so a drive that dedupes or
 * compresses cannot shortcut repeated writes of the same buffer. */
void stamp_write(void *buf, uint32_t len, uint64_t offset, uint64_t seq);

/* ---- fault injection (fault.c) */
/* Returns the (possibly changed) result of an I/O and adds any injected delay to *delay_ns. */
int64_t fault_apply(struct qual_fault *faults, uint32_t nfaults, int op, uint64_t off,
                    uint32_t len, int64_t res, uint64_t *delay_ns);
/* Sleep for an injected delay. */
void fault_delay(uint64_t ns);

/* ---- CRC32C (crc32c.c): standard init and final xor, so crc32c(crc32c(0, a), b) covers a+b */
uint32_t crc32c(uint32_t crc, const void *buf, uint64_t len);

/* ---- the one I/O queue (ioq.c; backends ioq_uring.c and ioq_psync.c, which are leaves).
 * The queue owns every in-flight I/O: its slot, buffer, submission, reaping, completion time,
 * fault injection, drain on error, deadline, cancel, back-off and stall. A client says what to
 * do next (next) and what a completion means (done); both are called on the thread that runs
 * the queue, never concurrently. No client calls the kernel's I/O itself. */
struct iovec;

struct ioq_io {
    int op;                   /* QUAL_OP_READ or QUAL_OP_WRITE */
    uint64_t off;
    uint32_t len;             /* bytes (a vector: their sum) */
    void *buf;                /* on next(): the slot's own buffer (NULL without queue buffers);
                                 the client may point it at memory of its own */
    const struct iovec *iov;  /* or a vector of the client's memory (then buf is unused) */
    unsigned nvec;
    uint64_t tag;             /* the client's */
    /* the queue's */
    unsigned slot;
    uint64_t t_submit;        /* CLOCK_MONOTONIC ns when handed over (latency, stall) */
    uint64_t t_first;         /* when first handed over (back-off on EAGAIN) */
    unsigned retries;
};

#define IOQ_LATER 2

struct ioq_client {
    void *ctx;
    /* The next I/O into *io: 1 when filled, 0 when there is nothing more to do, IOQ_LATER when
     * nothing can go before a completion (ask again after it), or a negative errno (with
     * qual_set_error) to stop. */
    int (*next)(void *ctx, struct ioq_io *io);
    /* A completion: res is the bytes moved or -errno (faults applied), lat_ns its latency.
     * 0 to go on, or a negative errno to stop; what is in flight then drains. */
    int (*done)(void *ctx, const struct ioq_io *io, int64_t res, uint64_t lat_ns);
    /* Optional: work done while I/Os are in flight (after what is staged goes to the kernel,
     * before the wait), so that it does not hold back the next submissions. */
    void (*between)(void *ctx);
};

struct ioq_opts {
    int backend;              /* resolved: QUAL_BACKEND_IO_URING or QUAL_BACKEND_PSYNC */
    int fd;
    unsigned depth;           /* I/Os in flight at most (io_uring; psync runs one at a time, as
                               * fio's psync ignores iodepth: ioq_open decides) */
    size_t buf_len;           /* the queue's buffer per slot (0: the client brings memory) */
    size_t align;             /* of those buffers */
    void *client_mem;         /* without queue buffers: the client's memory that I/Os land in, */
    size_t client_mem_len;    /* registered with the kernel where it can be (no pin per I/O) */
    unsigned submit_batch;    /* io_uring: I/Os per submission (0: all that are ready) */
    unsigned wait_batch;      /* io_uring: completions a wait asks for (0, 1: one); more
                               * saves system calls where no I/O's latency is measured */
    uint64_t deadline_ns;     /* issue nothing after this CLOCK_MONOTONIC time (QUAL_UNBOUNDED) */
    uint64_t stall_ns;        /* an I/O outstanding this long ends the run (-ETIMEDOUT) */
    const int *cancel;        /* the caller's cancel flag (may be NULL) */
    struct qual_fault *faults;
    uint32_t nfaults;
    int single_issuer;        /* io_uring: only the opening thread will run the queue */
};

/* The longest wait without looking at cancel, the deadline and the oldest I/O's age. */
#define IOQ_POLL_NS (50ull * 1000000ull)
/* An I/O outstanding this long is a stall, where the caller gives no timeout: NVMe's own
 * default command timeout (the nvme driver's io_timeout, 30 s). */
#define QUAL_COMMAND_TIMEOUT_NS (30ull * 1000000000ull)

struct ioq;
int ioq_open(struct ioq **out, const struct ioq_opts *o);
/* Point the queue at another descriptor, deadline or cancel flag (between runs). */
int ioq_set_fd(struct ioq *q, int fd);
void ioq_set_deadline(struct ioq *q, uint64_t deadline_ns);
void ioq_set_cancel(struct ioq *q, const int *cancel);
void *ioq_buf(struct ioq *q, unsigned slot);
unsigned ioq_depth(const struct ioq *q); /* its slots: the depth asked for, 1 under psync */
/* A client's I/O geometry, checked before anything is opened: an alignment that is a power of
 * two, a block size that is a multiple of it, a depth within 1..QUAL_MAX_DEPTH. */
int ioq_check_pieces(uint32_t align, uint32_t block_size, uint32_t depth);
/* Run until next() has nothing more and nothing is in flight: 0, or the first failure (the
 * client's, the backend's, -ECANCELED, -ETIMEDOUT for a stall) with qual_last_error() set. */
int ioq_run(struct ioq *q, const struct ioq_client *c);
/* Open a queue, run it once with a client, close it: 0 or the first failure. */
int ioq_run_once(const struct ioq_opts *o, const struct ioq_client *c);
/* Close; after a stall the kernel still owns I/Os and their memory, which is then left be. */
void ioq_close(struct ioq *q);
/* 1 when a stall or cancel left I/Os with the kernel: their memory must not be freed. */
int ioq_wedged(const struct ioq *q);
/* Close a target's descriptor, unless its storage stalled: that close would wait on the same
 * storage (a FUSE flush, an NFS commit) and hold the caller past every bound; the descriptor
 * is left to the process's exit instead (docs/ARCHITECTURE.md §4, "A watchdog"). */
void ioq_close_target(int fd, int stalled);

/* ---- backends: leaves of the queue */
struct ioq_backend {
    /* 0 where the backend works on this kernel, or a negative errno (qual_set_error). */
    int (*probe)(void);
    /* A backend state for the queue's options: `bufs` (bufs_len bytes) are its slot buffers,
     * NULL where the client brings its memory (o->client_mem). */
    int (*open)(const struct ioq_opts *o, void *bufs, size_t bufs_len, void **state);
    int (*set_fd)(void *state, int fd);
    void (*queue)(void *state, struct ioq_io *io);  /* stage one I/O */
    /* Hand staged I/Os over (submit) and wait up to timeout_ns for a completion (wait; a
     * backend with a tick may end the wait at its tick instead, within IOQ_POLL_NS: the queue
     * waits only while I/Os are in flight, and submits nothing before one comes back, so a
     * deadline passed meanwhile ends no more I/O for being seen sooner):
     * 0, -ETIME when the wait timed out, -EAGAIN/-EBUSY/-EINTR (try again) or -errno. */
    int (*enter)(void *state, int submit, int wait, uint64_t timeout_ns);
    int (*reap)(void *state, unsigned *slot, int64_t *res); /* 1 and a completion, or 0 */
    unsigned (*pending)(void *state); /* staged, not yet taken by the kernel */
    void (*close)(void *state, int wedged);
};
extern const struct ioq_backend ioq_uring_backend;
extern const struct ioq_backend ioq_psync_backend;

#endif
