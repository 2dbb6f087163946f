/* ioq.c — the one I/O queue (docs/ARCHITECTURE.md §3): a pool of slots, each an I/O in flight,
 * and the loop that fills them from a client, hands them to a backend, and brings them back:
 * completion time, fault injection, drain on error, deadline, cancel, back-off and stall. Every
 * wait is bounded; nothing here spins. The backends (ioq_uring.c, ioq_psync.c) are leaves, as
 * fio's ioengine_ops are: they only move I/Os to the kernel and back. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "engine.h"

/* EAGAIN/EBUSY (from the kernel or an I/O's completion) retried this long, then an error. */
#define BACKOFF_LIMIT_NS (5ull * 1000000000ull)
#define BACKOFF_MAX_NS (64ull * 1000000ull)
/* After a cancel, what is in flight has this long to come back before the queue gives up on
 * it (and leaves its memory to the kernel). */
#define CANCEL_GRACE_NS (1000ull * 1000000ull)

struct ioq {
    struct ioq_opts o;
    const struct ioq_backend *be;
    void *state;
    struct ioq_io *ios;       /* one per slot */
    unsigned *free_slots;
    unsigned nfree;
    unsigned inflight;        /* handed to the backend, not yet back */
    unsigned staged;          /* queued since the last enter */
    unsigned char *bufs;
    int wedged;
};

void process_cpu(double *user, double *sys)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6;
    *sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

int resolve_backend(int requested, int *chosen)
{
    *chosen = requested;
    if (requested == QUAL_BACKEND_PSYNC)
        return 0;
    int probe = ioq_uring_backend.probe();
    if (probe == 0)
        *chosen = QUAL_BACKEND_IO_URING;
    else if (requested == QUAL_BACKEND_AUTO)
        *chosen = QUAL_BACKEND_PSYNC;
    else
        return qual_set_error(probe, "io_uring is unavailable here: %s", strerror(-probe));
    return 0;
}

int qual_io_uring_probe(void)
{
    return ioq_uring_backend.probe();
}

int ioq_check_pieces(uint32_t align, uint32_t block_size, uint32_t depth)
{
    if (align == 0 || (align & (align - 1)))
        return qual_set_error(-EINVAL, "alignment %u is not a power of two", align);
    if (block_size == 0 || block_size % align)
        return qual_set_error(-EINVAL, "block size %u is not a multiple of the alignment %u",
                              block_size, align);
    if (depth == 0 || depth > QUAL_MAX_DEPTH)
        return qual_set_error(-EINVAL, "queue depth %u is outside 1..%d", depth,
                              QUAL_MAX_DEPTH);
    return 0;
}

unsigned ioq_depth(const struct ioq *q)
{
    return q->o.depth;
}

void *ioq_buf(struct ioq *q, unsigned slot)
{
    return q->bufs ? q->bufs + (size_t)slot * q->o.buf_len : NULL;
}

int ioq_wedged(const struct ioq *q)
{
    return q->wedged;
}

int ioq_open(struct ioq **out, const struct ioq_opts *o)
{
    *out = NULL;
    if (o->depth == 0 || o->depth > QUAL_MAX_DEPTH)
        return qual_set_error(-EINVAL, "queue depth %u is outside 1..%d", o->depth,
                              QUAL_MAX_DEPTH);
    if (o->backend != QUAL_BACKEND_IO_URING && o->backend != QUAL_BACKEND_PSYNC)
        return qual_set_error(-EINVAL, "backend %d is not a resolved one", o->backend);
    struct ioq *q = calloc(1, sizeof(*q));
    if (!q)
        return qual_set_error(-ENOMEM, "cannot allocate a queue");
    q->o = *o;
    /* psync is synchronous: one I/O at a time, whatever depth the client asks for (fio's
     * psync ignores iodepth too); the one place this rule lives */
    if (o->backend == QUAL_BACKEND_PSYNC)
        q->o.depth = 1;
    if (!q->o.stall_ns)
        q->o.stall_ns = QUAL_UNBOUNDED;
    q->be = o->backend == QUAL_BACKEND_IO_URING ? &ioq_uring_backend : &ioq_psync_backend;
    unsigned depth = q->o.depth;
    q->ios = calloc(depth, sizeof(*q->ios));
    q->free_slots = calloc(depth, sizeof(*q->free_slots));
    int rc = 0;
    if (!q->ios || !q->free_slots)
        rc = qual_set_error(-ENOMEM, "cannot allocate %u I/O slots", depth);
    if (!rc && o->buf_len) {
        q->bufs = io_memory_alloc(o->buf_len * depth, o->align);
        if (!q->bufs)
            rc = qual_set_error(-ENOMEM, "cannot allocate %u x %zu bytes of I/O buffers",
                                depth, o->buf_len);
    }
    for (unsigned i = 0; i < depth; i++)
        q->free_slots[i] = depth - 1 - i;
    q->nfree = depth;
    if (!rc)
        rc = q->be->open(&q->o, q->bufs, q->bufs ? o->buf_len * depth : 0, &q->state);
    if (rc) {
        ioq_close(q);
        return rc;
    }
    *out = q;
    return 0;
}

int ioq_set_fd(struct ioq *q, int fd)
{
    q->o.fd = fd;
    return q->be->set_fd(q->state, fd);
}

void ioq_set_deadline(struct ioq *q, uint64_t deadline_ns)
{
    q->o.deadline_ns = deadline_ns;
}

void ioq_set_cancel(struct ioq *q, const int *cancel)
{
    q->o.cancel = cancel;
}

void ioq_close_target(int fd, int stalled)
{
    if (fd >= 0 && !stalled)
        close(fd);
}

void ioq_close(struct ioq *q)
{
    if (!q)
        return;
    if (q->state)
        q->be->close(q->state, q->wedged);
    if (q->wedged)
        return; /* the kernel may still write into the buffers: they are left to it */
    io_memory_free(q->bufs, q->o.buf_len * q->o.depth);
    free(q->ios);
    free(q->free_slots);
    free(q);
}

int ioq_run_once(const struct ioq_opts *o, const struct ioq_client *c)
{
    struct ioq *q;
    int rc = ioq_open(&q, o);
    if (rc)
        return rc;
    rc = ioq_run(q, c);
    ioq_close(q);
    return rc;
}

static const char *op_name(int op)
{
    return op == QUAL_OP_WRITE ? "write" : "read";
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

static uint64_t backoff_ns(unsigned tries)
{
    uint64_t ns = 1000000ull << (tries < 6 ? tries : 6);
    return ns < BACKOFF_MAX_NS ? ns : BACKOFF_MAX_NS;
}

static void hand_over(struct ioq *q, struct ioq_io *io)
{
    io->t_submit = now_ns();
    q->be->queue(q->state, io);
    q->staged++;
}

/* Hand what is staged to the kernel without waiting: 0, or a hard error (a refusal to try
 * again, EAGAIN/EBUSY/EINTR, is met by the next submission). */
static int submit_staged(struct ioq *q)
{
    int e = q->be->enter(q->state, 1, 0, 0);
    q->staged = 0;
    return e == -EAGAIN || e == -EBUSY || e == -EINTR ? 0 : e;
}

/* One completion: faults, back-off on EAGAIN/EBUSY, latency, the client's verdict. Returns 0
 * or the client's (or the back-off's) failure. */
static int complete(struct ioq *q, const struct ioq_client *c, unsigned slot, int64_t res)
{
    struct ioq_io *io = &q->ios[slot];
    uint64_t lat = now_ns() - io->t_submit;
    if (q->o.nfaults) {
        uint64_t delay = 0;
        res = fault_apply(q->o.faults, q->o.nfaults, io->op, io->off, io->len, res, &delay);
        if (delay) {
            fault_delay(delay);
            lat += delay;
        }
    }
    if ((res == -EAGAIN || res == -EBUSY) && now_ns() - io->t_first < BACKOFF_LIMIT_NS) {
        sleep_ns(backoff_ns(io->retries++)); /* the device is busy: the same I/O again, later */
        hand_over(q, io);
        return 0;
    }
    q->inflight--;
    q->free_slots[q->nfree++] = slot;
    io->t_submit = 0;
    if (res == -EAGAIN || res == -EBUSY)
        return qual_set_error((int)res, "%s of %u bytes at offset %llu still failed with %s "
                              "after %.1f s of retries", op_name(io->op), io->len,
                              (unsigned long long)io->off, strerror((int)-res),
                              BACKOFF_LIMIT_NS / 1e9);
    return c->done(c->ctx, io, res, lat);
}

/* The oldest I/O still with the kernel (a free slot's t_submit is 0). */
static const struct ioq_io *oldest(const struct ioq *q)
{
    const struct ioq_io *old = NULL;
    for (unsigned s = 0; s < q->o.depth; s++)
        if (q->ios[s].t_submit && (!old || q->ios[s].t_submit < old->t_submit))
            old = &q->ios[s];
    return old;
}

int ioq_run(struct ioq *q, const struct ioq_client *c)
{
    const struct ioq_opts *o = &q->o;
    int rc = 0;           /* the first failure */
    int draining = 0;     /* issue nothing more */
    int wait_only = 0;    /* after a hard submission error: only bring back what was taken */
    uint64_t cancel_at = 0, busy_since = 0;
    unsigned busy_tries = 0;
    int issued = 0;       /* the deadline stops a queue that has issued at least once */
#define FAIL(err) do { int e_ = (err); if (!rc) rc = e_; draining = 1; } while (0)

    for (;;) {
        while (!draining && q->nfree) {
            if (o->cancel && __atomic_load_n(o->cancel, __ATOMIC_RELAXED)) {
                FAIL(qual_set_error(-ECANCELED, "cancelled"));
                break;
            }
            /* a worker that the scheduler woke after the deadline (a host whose cores are
             * busy) still issues one I/O: a round measures what it did, never nothing */
            if (issued && o->deadline_ns != QUAL_UNBOUNDED && now_ns() >= o->deadline_ns) {
                draining = 1;
                break;
            }
            unsigned slot = q->free_slots[q->nfree - 1];
            struct ioq_io *io = &q->ios[slot];
            memset(io, 0, sizeof(*io));
            io->slot = slot;
            io->buf = ioq_buf(q, slot);
            int n = c->next(c->ctx, io);
            if (n == IOQ_LATER) {
                if (!q->inflight) /* waiting for a completion with none to come */
                    FAIL(qual_set_error(-EDEADLK, "the client waits with nothing in flight"));
                break;
            }
            if (n <= 0) {
                if (n < 0)
                    FAIL(n);
                draining = 1;
                break;
            }
            q->nfree--;
            q->inflight++;
            issued = 1;
            hand_over(q, io);
            io->t_first = io->t_submit;
            /* a full batch goes to the kernel at once; the rest goes with the wait below */
            if (o->submit_batch && q->staged >= o->submit_batch && q->nfree) {
                int e = submit_staged(q);
                if (e) {
                    FAIL(e);
                    wait_only = 1;
                }
            }
        }
        if (q->inflight == 0)
            break;
        if (wait_only && q->inflight == q->be->pending(q->state))
            break; /* what is left was never taken by the kernel */

        uint64_t now = now_ns(), timeout = IOQ_POLL_NS;
        if (!draining && o->deadline_ns != QUAL_UNBOUNDED)
            timeout = o->deadline_ns > now ? o->deadline_ns - now : 0;
        if (timeout > IOQ_POLL_NS)
            timeout = IOQ_POLL_NS;
        if (c->between && !wait_only) {
            /* hand over first, then the client's work overlaps the device's; a refusal here
             * is met again by the submission with the wait below */
            if (q->be->pending(q->state))
                (void)q->be->enter(q->state, 1, 0, 0);
            c->between(c->ctx);
        }
        if (q->staged && q->staged == q->inflight && !wait_only) {
            /* everything in flight was just staged (depth 1 always): hand it over alone, as
             * fio does, and wait in a second call. A device that answers within the
             * submission (a queue worker run on this CPU as the call returns) then has its
             * completion ready for the wait, which need not sleep; one call that submits
             * and waits sleeps first and is woken, often on the other CPU
             * (benchmarks/bench_uring_features.py: 4 KiB at depth 1). */
            int e = submit_staged(q);
            if (e) {
                FAIL(e);
                wait_only = 1;
            }
        }
        unsigned want = 1;
        if (o->wait_batch > 1 && !draining)
            want = o->wait_batch < q->inflight ? o->wait_batch : q->inflight;
        int e = q->be->enter(q->state, !wait_only, (int)want, timeout);
        q->staged = 0;
        unsigned reaped = 0, slot;
        int64_t res;
        while (q->be->reap(q->state, &slot, &res)) {
            reaped++;
            int crc = complete(q, c, slot, res);
            if (crc)
                FAIL(crc);
        }
        if (e == -EAGAIN || e == -EBUSY || e == -EINTR) {
            if (reaped) {
                busy_since = 0;
            } else {
                /* the kernel is short of something: wait, a little longer each time */
                if (!busy_since)
                    busy_since = now_ns();
                else if (now_ns() - busy_since > BACKOFF_LIMIT_NS) {
                    FAIL(qual_set_error(e, "the kernel kept refusing I/O with %s for %.1f s",
                                        strerror(-e), BACKOFF_LIMIT_NS / 1e9));
                    wait_only = 1;
                }
                sleep_ns(backoff_ns(busy_tries++));
            }
        } else if (e && e != -ETIME) {
            FAIL(e);
            wait_only = 1; /* the kernel still owns what it took: bring it back */
        } else {
            busy_since = 0;
            busy_tries = 0;
        }
        if (reaped)
            continue;
        /* nothing came back within the wait: look at cancel and the oldest I/O's age */
        now = now_ns();
        if (o->cancel && __atomic_load_n(o->cancel, __ATOMIC_RELAXED)) {
            if (!cancel_at) {
                cancel_at = now;
                FAIL(qual_set_error(-ECANCELED, "cancelled"));
            } else if (now - cancel_at > CANCEL_GRACE_NS) {
                q->wedged = 1; /* cancelled, and the kernel keeps its I/Os: leave them */
                break;
            }
        }
        const struct ioq_io *old = oldest(q);
        if (old && now - old->t_submit >= o->stall_ns) {
            q->wedged = 1;
            int err = qual_set_error(-ETIMEDOUT, "%s of %u bytes at offset %llu has been "
                                     "outstanding for %.1f s (command timeout %.1f s): the "
                                     "device stalled", op_name(old->op), old->len,
                                     (unsigned long long)old->off,
                                     (now - old->t_submit) / 1e9, o->stall_ns / 1e9);
            rc = rc && rc != -ECANCELED ? rc : err;
            break;
        }
    }
#undef FAIL
    return rc;
}
