/* ioq_psync.c — the pread/pwrite backend of the queue: `depth` threads do synchronous I/O, so
 * the device sees as many requests in flight as with a ring. To the queue they are the kernel:
 * staged I/Os go to them, completions come back, and a wait has a timeout. A thread stuck in
 * a stalled I/O is left behind with its memory when the queue gives up on it. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "engine.h"

struct pool {
    struct ioq_io **todo;     /* staged, in order: a ring of depth entries */
    unsigned todo_head, ntodo;
    unsigned *done_slot;      /* completed: a ring of depth entries */
    int64_t *done_res;
    unsigned done_head, ndone;
    unsigned depth;
    int fd;
    int closing;
    pthread_mutex_t lock;
    pthread_cond_t work;
    pthread_cond_t came_back;
    pthread_t *threads;
    unsigned nthreads;
};

static void *worker(void *p)
{
    struct pool *pl = p;
    pthread_mutex_lock(&pl->lock);
    for (;;) {
        while (!pl->closing && pl->ntodo == 0)
            pthread_cond_wait(&pl->work, &pl->lock);
        if (pl->closing)
            break;
        struct ioq_io *io = pl->todo[pl->todo_head];
        pl->todo_head = (pl->todo_head + 1) % pl->depth;
        pl->ntodo--;
        int fd = pl->fd;
        pthread_mutex_unlock(&pl->lock);
        ssize_t n;
        do {
            if (io->iov)
                n = io->op == QUAL_OP_WRITE ? pwritev(fd, io->iov, (int)io->nvec, (off_t)io->off)
                                            : preadv(fd, io->iov, (int)io->nvec, (off_t)io->off);
            else
                n = io->op == QUAL_OP_WRITE ? pwrite(fd, io->buf, io->len, (off_t)io->off)
                                            : pread(fd, io->buf, io->len, (off_t)io->off);
        } while (n < 0 && errno == EINTR);
        int64_t res = n < 0 ? -(int64_t)errno : (int64_t)n;
        pthread_mutex_lock(&pl->lock);
        unsigned at = (pl->done_head + pl->ndone) % pl->depth;
        pl->done_slot[at] = io->slot;
        pl->done_res[at] = res;
        pl->ndone++;
        pthread_cond_signal(&pl->came_back);
    }
    pthread_mutex_unlock(&pl->lock);
    return NULL;
}

static void pool_free(struct pool *pl)
{
    pthread_mutex_destroy(&pl->lock);
    pthread_cond_destroy(&pl->work);
    pthread_cond_destroy(&pl->came_back);
    free(pl->todo);
    free(pl->done_slot);
    free(pl->done_res);
    free(pl->threads);
    free(pl);
}

static void psync_close(void *state, int wedged)
{
    struct pool *pl = state;
    if (!pl)
        return;
    pthread_mutex_lock(&pl->lock);
    pl->closing = 1;
    pthread_cond_broadcast(&pl->work);
    pthread_mutex_unlock(&pl->lock);
    for (unsigned i = 0; i < pl->nthreads; i++) {
        if (wedged)
            pthread_detach(pl->threads[i]); /* one may be stuck in the kernel: it ends later */
        else
            pthread_join(pl->threads[i], NULL);
    }
    if (!wedged)
        pool_free(pl);
}

static int psync_probe(void)
{
    return 0; /* pread and pwrite work everywhere */
}

static int psync_open(const struct ioq_opts *o, void *bufs, size_t bufs_len, void **state)
{
    (void)bufs, (void)bufs_len; /* the threads read and write the slots' buffers in place */
    struct pool *pl = calloc(1, sizeof(*pl));
    if (!pl)
        return qual_set_error(-ENOMEM, "cannot allocate a thread pool");
    pl->depth = o->depth;
    pl->fd = o->fd;
    pl->todo = calloc(o->depth, sizeof(*pl->todo));
    pl->done_slot = calloc(o->depth, sizeof(*pl->done_slot));
    pl->done_res = calloc(o->depth, sizeof(*pl->done_res));
    pl->threads = calloc(o->depth, sizeof(*pl->threads));
    pthread_mutex_init(&pl->lock, NULL);
    pthread_cond_init(&pl->work, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&pl->came_back, &ca);
    pthread_condattr_destroy(&ca);
    if (!pl->todo || !pl->done_slot || !pl->done_res || !pl->threads) {
        pool_free(pl);
        return qual_set_error(-ENOMEM, "cannot allocate a pool of %u threads", o->depth);
    }
    *state = pl;
    for (; pl->nthreads < o->depth; pl->nthreads++) {
        int rc = pthread_create(&pl->threads[pl->nthreads], NULL, worker, pl);
        if (rc)
            return qual_set_error(-rc, "cannot start I/O thread %u: %s", pl->nthreads,
                                  strerror(rc));
    }
    return 0;
}

static int psync_set_fd(void *state, int fd)
{
    struct pool *pl = state;
    pthread_mutex_lock(&pl->lock);
    pl->fd = fd;
    pthread_mutex_unlock(&pl->lock);
    return 0;
}

static void psync_queue(void *state, struct ioq_io *io)
{
    struct pool *pl = state;
    pthread_mutex_lock(&pl->lock);
    pl->todo[(pl->todo_head + pl->ntodo) % pl->depth] = io;
    pl->ntodo++;
    pthread_cond_signal(&pl->work);
    pthread_mutex_unlock(&pl->lock);
}

static unsigned psync_pending(void *state)
{
    struct pool *pl = state;
    pthread_mutex_lock(&pl->lock);
    unsigned n = pl->ntodo;
    pthread_mutex_unlock(&pl->lock);
    return n;
}

static int psync_enter(void *state, int submit, int wait, uint64_t timeout_ns)
{
    (void)submit; /* queued I/Os are with the threads already */
    struct pool *pl = state;
    if (!wait)
        return 0;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + timeout_ns;
    until.tv_sec += (time_t)(ns / 1000000000ull);
    until.tv_nsec = (long)(ns % 1000000000ull);
    int rc = 0;
    pthread_mutex_lock(&pl->lock);
    while (pl->ndone == 0 && rc == 0)
        rc = pthread_cond_timedwait(&pl->came_back, &pl->lock, &until);
    int got = pl->ndone > 0;
    pthread_mutex_unlock(&pl->lock);
    return got ? 0 : -ETIME;
}

static int psync_reap(void *state, unsigned *slot, int64_t *res)
{
    struct pool *pl = state;
    pthread_mutex_lock(&pl->lock);
    int got = pl->ndone > 0;
    if (got) {
        *slot = pl->done_slot[pl->done_head];
        *res = pl->done_res[pl->done_head];
        pl->done_head = (pl->done_head + 1) % pl->depth;
        pl->ndone--;
    }
    pthread_mutex_unlock(&pl->lock);
    return got;
}

const struct ioq_backend ioq_psync_backend = {
    .probe = psync_probe,
    .open = psync_open,
    .set_fd = psync_set_fd,
    .queue = psync_queue,
    .enter = psync_enter,
    .reap = psync_reap,
    .pending = psync_pending,
    .close = psync_close,
};
