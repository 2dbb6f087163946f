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

/* ---- the backend to use for one asked for (auto: io_uring where it works, else psync) */
int resolve_backend(int requested, int *chosen);

/* ---- the whole process's user and system CPU seconds so far (job.c) */
void process_cpu(double *user, double *sys);

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

/* ---- a running job (job.c) */
struct jobrun {
    const struct qual_job *job;
    struct qual_ctl *ctl;
    int backend;
    uint64_t deadline_ns;     /* QUAL_UNBOUNDED: no time bound */
    int stop;                 /* atomic: set on error, cancel or bound */
    int setup_failed;
    pthread_mutex_t gate;     /* start gate: streams report ready, then wait for open */
    pthread_cond_t gate_cv;
    uint64_t ready;
    int open;
    pthread_mutex_t lock;     /* guards the first error */
    int error;
    int error_op;
    uint64_t error_offset;
    char error_msg[256];
};

/* One worker: an open descriptor and a share of the job (a sequential slice, or a random
 * stream over the whole region), served by one ring or by queue_depth psync threads. */
struct worker {
    struct jobrun *run;
    unsigned index;
    int fd;
    uint64_t lo;              /* first byte of the worker's range */
    uint64_t nblocks;         /* blocks in the worker's range */
    uint64_t quota;           /* blocks this worker may issue (0: none; QUAL_UNBOUNDED: no
                                 byte bound) */
    uint64_t claimed;         /* atomic: blocks issued so far */
    uint64_t write_seq;       /* atomic: write sequence for stamp_write */
};

/* One stream of I/Os with its own accounting: a ring thread, or one psync thread. */
struct stream {
    struct jobrun *run;
    struct worker *w;
    unsigned lane;
    struct rng rng;
    uint64_t bytes;
    uint64_t ops;
    struct qual_hist hist;
};

/* Claim the next I/O of the stream: 1 and its offset, or 0 when the stream must stop. */
int job_claim(struct stream *s, uint64_t *off);
/* Account a completed I/O (res = bytes transferred or -errno). 0, or -errno after recording
 * the job's failure. buf holds the data for a read (checked in verify mode). */
int job_complete(struct stream *s, int op, uint64_t off, int64_t res, uint64_t lat_ns,
                 const void *buf);
/* Record the job's first failure and make every stream stop; returns err. */
int job_fail(struct jobrun *run, int err, int op, uint64_t off, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int job_stopping(struct jobrun *run);
/* Prepare the buffer of a write at off (pattern in verify mode, else a unique stamp). */
void job_prepare_write(struct stream *s, void *buf, uint64_t off);

/* ---- CRC32C (crc32c.c): standard init and final xor, so crc32c(crc32c(0, a), b) covers a+b */
uint32_t crc32c(uint32_t crc, const void *buf, uint64_t len);

/* ---- io_uring primitives (ring.c): a ring on one descriptor with `depth` registered buffers
 * of buf_len bytes; slot i uses buffer i and completes with user_data i */
struct ring;
int ring_open(struct ring **out, int target_fd, unsigned depth, size_t buf_len, size_t align,
              int single_issuer);
void ring_close(struct ring *r);
int ring_set_file(struct ring *r, int target_fd); /* point the ring at another descriptor */
void *ring_buf(struct ring *r, unsigned slot);
void ring_queue(struct ring *r, int op, unsigned slot, uint64_t off, uint32_t len);
unsigned ring_pending(const struct ring *r);    /* queued, not yet taken by the kernel */
int ring_submit(struct ring *r, unsigned wait);  /* hand over the queue; wait for 1 if asked */
int ring_wait(struct ring *r);                   /* wait for a completion, submit nothing */
int ring_reap(struct ring *r, uint64_t *user_data, int32_t *res); /* 1 and a completion, or 0 */
/* A vectored read or write into the caller's memory (buf_len 0 at ring_open: no ring buffers). */
struct iovec;
void ring_queue_vec(struct ring *r, int op, uint64_t user_data, const struct iovec *iov,
                    unsigned nvec, uint64_t off);

/* ---- backends: set up (before the start barrier), then run until job_claim says stop */
struct ring_state;
int ring_setup(struct stream *s, struct ring_state **out);
int ring_run(struct stream *s, struct ring_state *rs);
void ring_teardown(struct ring_state *rs);

int psync_setup(struct stream *s, void **buf);
int psync_run(struct stream *s, void *buf);

#endif
