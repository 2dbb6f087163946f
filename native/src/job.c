/* job.c — runs one I/O job, a client of the queue (ioq.c): validates it, opens the target
 * once per worker, gives each worker a queue and a share of the job (a sequential slice, or a
 * random stream over the whole region, and its share of the byte bound), and turns their
 * accounting into one qual_result. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"

#define MAX_DEPTH ((unsigned)QUAL_MAX_DEPTH)
#define MAX_WORKERS ((unsigned)QUAL_MAX_WORKERS)
#define MAX_BLOCK ((unsigned)QUAL_MAX_BLOCK)
#define MAX_THREADS 4096u

static const char *op_name(int op)
{
    return op == QUAL_OP_WRITE ? "write" : "read";
}

/* A running job: what every worker shares. */
struct jobrun {
    const struct qual_job *job;
    struct qual_ctl *ctl;
    int backend;
    uint64_t deadline_ns;     /* QUAL_UNBOUNDED: no time bound */
    int stop;                 /* atomic: set on the first error, so every worker stops */
    pthread_mutex_t gate;     /* start gate: workers report ready, then wait for open */
    pthread_cond_t gate_cv;
    unsigned ready;
    unsigned finished;        /* workers past their queue's run */
    int open;
    int setup_failed;
    pthread_mutex_t lock;     /* guards the first error */
    int error;
    int error_op;
    uint64_t error_offset;
    char error_msg[256];
};

/* One worker: a descriptor, a queue, and its share of the job with its own accounting. */
struct worker {
    struct jobrun *run;
    unsigned index;
    pthread_t tid;
    int started;
    int wedged;               /* its queue gave up on I/Os the kernel kept: it detached */
    int fd;
    struct ioq *q;
    uint64_t lo;              /* first byte of the worker's range */
    uint64_t nblocks;         /* blocks in the worker's range */
    uint64_t quota;           /* blocks this worker may issue (QUAL_UNBOUNDED: no byte bound) */
    uint64_t issued;
    uint64_t write_seq;
    struct rng rng;
    struct qual_dir dir[2];   /* by direction */
};

static int job_fail(struct jobrun *run, int err, int op, uint64_t off, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int job_fail(struct jobrun *run, int err, int op, uint64_t off, const char *fmt, ...)
{
    pthread_mutex_lock(&run->lock);
    if (run->error == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(run->error_msg, sizeof(run->error_msg), fmt, ap);
        va_end(ap);
        run->error = err;
        run->error_op = op;
        run->error_offset = off;
    }
    pthread_mutex_unlock(&run->lock);
    __atomic_store_n(&run->stop, 1, __ATOMIC_RELAXED);
    return err;
}

/* The queue asks for the worker's next I/O. */
static int worker_next(void *ctx, struct ioq_io *io)
{
    struct worker *w = ctx;
    struct jobrun *run = w->run;
    const struct qual_job *job = run->job;
    if (__atomic_load_n(&run->stop, __ATOMIC_RELAXED) || w->issued >= w->quota)
        return 0;
    uint64_t k = w->issued++;
    uint64_t block = job->pattern == QUAL_RANDOM ? rng_below(&w->rng, w->nblocks)
                                                 : k % w->nblocks;
    io->op = job->op;
    if (job->op == QUAL_OP_MIXED)
        io->op = rng_below(&w->rng, 100) < job->rwmixread ? QUAL_OP_READ : QUAL_OP_WRITE;
    io->off = w->lo + block * job->block_size;
    io->len = job->block_size;
    if (io->op == QUAL_OP_WRITE) {
        if (job->verify)
            qual_pattern_fill(io->buf, job->block_size, job->seed, io->off);
        else
            stamp_write(io->buf, job->block_size, io->off, ++w->write_seq);
    }
    return 1;
}

/* The queue brings a completion back. */
static int worker_done(void *ctx, const struct ioq_io *io, int64_t res, uint64_t lat_ns)
{
    struct worker *w = ctx;
    struct jobrun *run = w->run;
    const struct qual_job *job = run->job;
    const uint32_t len = io->len;
    if (res < 0)
        return job_fail(run, (int)res, io->op, io->off, "%s of %u bytes at offset %llu failed: %s",
                        op_name(io->op), len, (unsigned long long)io->off, strerror((int)-res));
    if ((uint64_t)res != len)
        return job_fail(run, -EIO, io->op, io->off, "short %s: %lld of %u bytes at offset %llu",
                        op_name(io->op), (long long)res, len, (unsigned long long)io->off);
    if (job->verify && io->op == QUAL_OP_READ) {
        uint64_t bad = io->off;
        if (qual_pattern_check(io->buf, len, job->seed, io->off, &bad) != 0)
            return job_fail(run, -EBADMSG, io->op, bad,
                            "data read at offset %llu is not what was written there",
                            (unsigned long long)bad);
    }
    struct qual_dir *d = &w->dir[io->op];
    qual_hist_record(&d->lat, lat_ns);
    d->bytes += len;
    d->ops++;
    __atomic_add_fetch(&run->ctl->bytes_done, len, __ATOMIC_RELAXED);
    __atomic_add_fetch(&run->ctl->ops_done, 1, __ATOMIC_RELAXED);
    return 0;
}

static int validate(const struct qual_job *job)
{
    if (!job->path || !*job->path)
        return qual_set_error(-EINVAL, "job has no target path");
    if (job->op != QUAL_OP_READ && job->op != QUAL_OP_WRITE && job->op != QUAL_OP_MIXED)
        return qual_set_error(-EINVAL, "op %d is neither read, write nor mixed", job->op);
    if (job->op == QUAL_OP_MIXED && job->rwmixread > 100)
        return qual_set_error(-EINVAL, "a mixed job's read share %u%% is above 100%%",
                              job->rwmixread);
    if (job->pattern != QUAL_SEQUENTIAL && job->pattern != QUAL_RANDOM)
        return qual_set_error(-EINVAL, "pattern %d is neither sequential nor random", job->pattern);
    if (job->backend < QUAL_BACKEND_AUTO || job->backend > QUAL_BACKEND_PSYNC)
        return qual_set_error(-EINVAL, "backend %d is unknown", job->backend);
    if (job->align == 0 || (job->align & (job->align - 1)))
        return qual_set_error(-EINVAL, "alignment %u is not a power of two", job->align);
    if (job->block_size == 0 || job->block_size > MAX_BLOCK)
        return qual_set_error(-EINVAL, "block size %u is outside 1..%u", job->block_size,
                              MAX_BLOCK);
    if (job->block_size % job->align)
        return qual_set_error(-EINVAL, "block size %u is not a multiple of the alignment %u",
                              job->block_size, job->align);
    if (job->offset % job->align)
        return qual_set_error(-EINVAL, "region offset %llu is not a multiple of the alignment %u",
                              (unsigned long long)job->offset, job->align);
    if (job->verify && job->block_size % 512)
        return qual_set_error(-EINVAL, "verify needs a block size that is a multiple of 512");
    if (job->queue_depth == 0 || job->queue_depth > MAX_DEPTH)
        return qual_set_error(-EINVAL, "queue depth %u is outside 1..%u", job->queue_depth,
                              MAX_DEPTH);
    if (job->submit_batch > job->queue_depth)
        return qual_set_error(-EINVAL, "submit batch %u is above the queue depth %u",
                              job->submit_batch, job->queue_depth);
    if (job->workers == 0 || job->workers > MAX_WORKERS)
        return qual_set_error(-EINVAL, "workers %u is outside 1..%u", job->workers, MAX_WORKERS);
    if (job->bytes == QUAL_UNBOUNDED && job->runtime_ns == QUAL_UNBOUNDED)
        return qual_set_error(-EINVAL, "job has no bound: give bytes, runtime or both");
    if (job->bytes == 0)
        return qual_set_error(-EINVAL, "a byte bound of 0 moves nothing");
    if (job->bytes != QUAL_UNBOUNDED && job->bytes % job->block_size)
        return qual_set_error(-EINVAL, "byte bound %llu is not a whole number of %u-byte blocks",
                              (unsigned long long)job->bytes, job->block_size);
    if (job->runtime_ns == 0)
        return qual_set_error(-EINVAL, "a time bound of 0 ns ends before the job starts");
    uint64_t nblocks = job->size / job->block_size;
    if (nblocks == 0)
        return qual_set_error(-EINVAL, "region of %llu bytes holds no %u-byte block",
                              (unsigned long long)job->size, job->block_size);
    if (job->pattern == QUAL_SEQUENTIAL && nblocks < job->workers)
        return qual_set_error(-EINVAL, "region of %llu blocks cannot be split over %u workers",
                              (unsigned long long)nblocks, job->workers);
    if (job->nfaults && !job->faults)
        return qual_set_error(-EINVAL, "fault count without faults");
    return 0;
}

static int open_target(const struct qual_job *job, int *fd_out)
{
    static const int access[] = {O_RDONLY, O_WRONLY, O_RDWR};
    return target_open(job->path, access[job->op] | (job->direct ? O_DIRECT : 0), &job->expect,
                       job->op == QUAL_OP_MIXED ? "read and write" : op_name(job->op), fd_out);
}

/* The region must lie inside the target; a regular file may grow under writes. */
static int check_extent(const struct qual_job *job, int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return qual_set_error(-errno, "stat %s: %s", job->path, strerror(errno));
    uint64_t size;
    if (S_ISBLK(st.st_mode)) {
        if (ioctl(fd, BLKGETSIZE64, &size) != 0)
            return qual_set_error(-errno, "size of %s: %s", job->path, strerror(errno));
    } else if (S_ISREG(st.st_mode)) {
        if (job->op == QUAL_OP_WRITE)
            return 0;
        size = (uint64_t)st.st_size;
    } else {
        return qual_set_error(-ENOTSUP, "%s is neither a regular file nor a block device",
                              job->path);
    }
    uint64_t end = job->offset + job->size / job->block_size * job->block_size;
    if (end > size)
        return qual_set_error(-EINVAL, "region ends at %llu, beyond the end of %s (%llu bytes)",
                              (unsigned long long)end, job->path, (unsigned long long)size);
    return 0;
}

static void *worker_main(void *p)
{
    struct worker *w = p;
    struct jobrun *run = w->run;
    const struct qual_job *job = run->job;
    struct ioq_opts o = {
        .backend = run->backend,
        .fd = w->fd,
        .depth = job->queue_depth,
        .buf_len = job->block_size,
        .align = job->align,
        .submit_batch = job->submit_batch,
        .deadline_ns = QUAL_UNBOUNDED, /* set once every worker is ready */
        .stall_ns = job->command_timeout_ns ? job->command_timeout_ns
                                            : QUAL_COMMAND_TIMEOUT_NS,
        .cancel = &run->ctl->cancel,
        .faults = job->faults,
        .nfaults = job->nfaults,
        .single_issuer = 1,
    };
    int rc = ioq_open(&w->q, &o);
    if (rc) {
        job_fail(run, rc, -1, 0, "%s", qual_last_error());
        __atomic_store_n(&run->setup_failed, 1, __ATOMIC_RELAXED);
    } else if (job->op != QUAL_OP_READ) {
        for (unsigned i = 0; i < ioq_depth(w->q); i++)
            qual_fill_random(ioq_buf(w->q, i), job->block_size,
                             job->seed ^ mix64(((uint64_t)w->index << 32) + i + 1));
    }
    pthread_mutex_lock(&run->gate);
    run->ready++;
    pthread_cond_broadcast(&run->gate_cv);
    while (!run->open)
        pthread_cond_wait(&run->gate_cv, &run->gate);
    pthread_mutex_unlock(&run->gate);
    if (!__atomic_load_n(&run->setup_failed, __ATOMIC_RELAXED)) {
        struct ioq_client c = {w, worker_next, worker_done, NULL};
        ioq_set_deadline(w->q, run->deadline_ns);
        rc = ioq_run(w->q, &c);
        if (rc)
            job_fail(run, rc, -1, 0, "%s", qual_last_error());
    }
    pthread_mutex_lock(&run->gate);
    /* A thread that leaves I/Os with the kernel cannot finish exiting until they come back
     * (io_uring cancels a task's requests at its exit), so nobody waits for it to. */
    w->wedged = w->q && ioq_wedged(w->q);
    if (w->wedged)
        pthread_detach(pthread_self());
    run->finished++;
    pthread_cond_broadcast(&run->gate_cv);
    pthread_mutex_unlock(&run->gate);
    return NULL;
}

static void split_region(const struct qual_job *job, struct worker *workers)
{
    uint64_t nblocks = job->size / job->block_size;
    uint64_t quota_blocks = job->bytes / job->block_size;
    for (uint32_t i = 0; i < job->workers; i++) {
        struct worker *w = &workers[i];
        if (job->pattern == QUAL_SEQUENTIAL) {
            uint64_t first = nblocks * i / job->workers;
            uint64_t last = nblocks * (i + 1) / job->workers;
            w->lo = job->offset + first * job->block_size;
            w->nblocks = last - first;
        } else {
            w->lo = job->offset;
            w->nblocks = nblocks;
        }
        /* every worker gets an equal share; the remainder goes to the first ones, and a
         * worker whose share is zero issues nothing */
        w->quota = job->bytes == QUAL_UNBOUNDED
                       ? QUAL_UNBOUNDED
                       : quota_blocks / job->workers + (i < quota_blocks % job->workers);
    }
}

int qual_job_run(const struct qual_job *job, struct qual_ctl *ctl, struct qual_result *res)
{
    if (!job || !ctl || !res)
        return qual_set_error(-EINVAL, "job, ctl or result is NULL");
    memset(res, 0, sizeof(*res));
    qual_hist_init(&res->lat);
    qual_hist_init(&res->dir[0].lat);
    qual_hist_init(&res->dir[1].lat);
    res->error_op = -1;
    int rc = validate(job);
    if (rc)
        goto early;
    int backend;
    rc = resolve_backend(job->backend, &backend);
    if (rc)
        goto early;
    res->backend = backend;
    /* psync: each worker and the one I/O thread its queue runs (ioq_open) */
    uint64_t nthreads = (uint64_t)job->workers * (backend == QUAL_BACKEND_PSYNC ? 2 : 1);
    if (nthreads > MAX_THREADS) {
        rc = qual_set_error(-EINVAL, "%llu threads for %u workers is more than %u",
                            (unsigned long long)nthreads, job->workers, MAX_THREADS);
        goto early;
    }

    struct jobrun run;
    memset(&run, 0, sizeof(run));
    run.job = job;
    run.ctl = ctl;
    run.backend = backend;
    run.error_op = -1;
    run.deadline_ns = QUAL_UNBOUNDED;
    pthread_mutex_init(&run.lock, NULL);
    pthread_mutex_init(&run.gate, NULL);
    pthread_cond_init(&run.gate_cv, NULL);

    struct worker *workers = calloc(job->workers, sizeof(*workers));
    if (!workers) {
        rc = qual_set_error(-ENOMEM, "no memory for %u workers", job->workers);
        goto out;
    }
    split_region(job, workers);
    uint32_t opened = 0;
    for (; opened < job->workers; opened++) {
        struct worker *w = &workers[opened];
        w->run = &run;
        w->index = opened;
        w->fd = -1;
        rng_seed(&w->rng, job->seed ^ mix64(opened + 1));
        qual_hist_init(&w->dir[0].lat);
        qual_hist_init(&w->dir[1].lat);
        rc = open_target(job, &w->fd);
        if (!rc && opened == 0)
            rc = check_extent(job, w->fd);
        if (rc)
            break;
    }
    if (rc)
        goto out;

    unsigned started = 0;
    for (uint32_t i = 0; i < job->workers; i++) {
        int prc = pthread_create(&workers[i].tid, NULL, worker_main, &workers[i]);
        if (prc) {
            job_fail(&run, -prc, -1, 0, "cannot start worker %u: %s", i, strerror(prc));
            __atomic_store_n(&run.setup_failed, 1, __ATOMIC_RELAXED);
            break;
        }
        workers[i].started = 1;
        started++;
    }
    /* every started worker is set up (queue, buffers) before the clock starts */
    pthread_mutex_lock(&run.gate);
    while (run.ready < started)
        pthread_cond_wait(&run.gate_cv, &run.gate);
    double u0, s0;
    process_cpu(&u0, &s0);
    uint64_t t_start = now_ns();
    run.deadline_ns = job->runtime_ns >= QUAL_UNBOUNDED - t_start ? QUAL_UNBOUNDED
                                                                   : t_start + job->runtime_ns;
    run.open = 1;
    pthread_cond_broadcast(&run.gate_cv);
    while (run.finished < started)
        pthread_cond_wait(&run.gate_cv, &run.gate);
    pthread_mutex_unlock(&run.gate);
    for (uint32_t i = 0; i < job->workers; i++)
        if (workers[i].started && !workers[i].wedged)
            pthread_join(workers[i].tid, NULL);

    if (job->op != QUAL_OP_READ && !run.error) {
        /* durability is part of a write's time: one fdatasync covers every descriptor of the
         * same file or device */
        if (fdatasync(workers[0].fd) != 0)
            job_fail(&run, -errno, QUAL_OP_WRITE, 0, "fdatasync %s: %s", job->path,
                     strerror(errno));
    }
    uint64_t t_end = now_ns();
    double u1, s1;
    process_cpu(&u1, &s1);
    for (uint32_t i = 0; i < job->workers; i++) {
        for (int d = 0; d < 2; d++) {
            const struct qual_dir *wd = &workers[i].dir[d];
            res->dir[d].bytes += wd->bytes;
            res->dir[d].ops += wd->ops;
            qual_hist_merge(&res->dir[d].lat, &wd->lat);
            res->bytes += wd->bytes;
            res->ops += wd->ops;
            qual_hist_merge(&res->lat, &wd->lat);
        }
    }
    res->elapsed_ns = t_end - t_start;
    res->cpu_user_s = u1 - u0;
    res->cpu_sys_s = s1 - s0;
    rc = run.error;

out:
    if (workers) {
        for (uint32_t i = 0; i < job->workers; i++) {
            ioq_close(workers[i].q);
            ioq_close_target(workers[i].fd, workers[i].wedged || rc == -ETIMEDOUT);
        }
    }
    free(workers);
    pthread_cond_destroy(&run.gate_cv);
    pthread_mutex_destroy(&run.gate);
    pthread_mutex_destroy(&run.lock);
    if (run.error) {
        res->error = run.error;
        res->error_op = run.error_op;
        res->error_offset = run.error_offset;
        memcpy(res->error_msg, run.error_msg, sizeof(res->error_msg));
        qual_set_error(run.error, "%s", run.error_msg);
        return run.error;
    }
    if (!rc)
        return 0;
early:
    res->error = rc;
    snprintf(res->error_msg, sizeof(res->error_msg), "%s", qual_last_error());
    return rc;
}
