/* job.c — runs one I/O job: validates it, opens the target, starts the workers' streams on
 * the chosen backend, and turns their accounting into one qual_result. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"

#define MAX_DEPTH 4096u
#define MAX_WORKERS 1024u
#define MAX_BLOCK (64u << 20)
#define MAX_THREADS 4096u

static const char *op_name(int op)
{
    return op == QUAL_OP_WRITE ? "write" : "read";
}

int job_stopping(struct jobrun *run)
{
    return __atomic_load_n(&run->stop, __ATOMIC_RELAXED);
}

int job_fail(struct jobrun *run, int err, int op, uint64_t off, const char *fmt, ...)
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

int job_claim(struct stream *s, uint64_t *off)
{
    struct jobrun *run = s->run;
    struct worker *w = s->w;
    const struct qual_job *job = run->job;

    if (job_stopping(run))
        return 0;
    if (__atomic_load_n(&run->ctl->cancel, __ATOMIC_RELAXED)) {
        job_fail(run, -ECANCELED, -1, 0, "cancelled");
        return 0;
    }
    if (run->deadline_ns != QUAL_UNBOUNDED && now_ns() >= run->deadline_ns)
        return 0;
    uint64_t k = __atomic_fetch_add(&w->claimed, 1, __ATOMIC_RELAXED);
    if (k >= w->quota)
        return 0;
    uint64_t block = job->pattern == QUAL_RANDOM ? rng_below(&s->rng, w->nblocks)
                                                 : k % w->nblocks;
    *off = w->lo + block * job->block_size;
    return 1;
}

void job_prepare_write(struct stream *s, void *buf, uint64_t off)
{
    const struct qual_job *job = s->run->job;
    if (job->verify)
        qual_pattern_fill(buf, job->block_size, job->seed, off);
    else
        stamp_write(buf, job->block_size, off,
                    __atomic_add_fetch(&s->w->write_seq, 1, __ATOMIC_RELAXED));
}

int job_complete(struct stream *s, int op, uint64_t off, int64_t res, uint64_t lat_ns,
                 const void *buf)
{
    struct jobrun *run = s->run;
    const struct qual_job *job = run->job;
    uint32_t len = job->block_size;

    if (job->nfaults) {
        uint64_t delay = 0;
        res = fault_apply(job->faults, job->nfaults, op, off, len, res, &delay);
        if (delay) {
            fault_delay(delay);
            lat_ns += delay;
        }
    }
    if (res < 0)
        return job_fail(run, (int)res, op, off, "%s of %u bytes at offset %llu failed: %s",
                        op_name(op), len, (unsigned long long)off, strerror((int)-res));
    if ((uint64_t)res != len)
        return job_fail(run, -EIO, op, off, "short %s: %lld of %u bytes at offset %llu",
                        op_name(op), (long long)res, len, (unsigned long long)off);
    if (job->verify && op == QUAL_OP_READ) {
        uint64_t bad = off;
        if (qual_pattern_check(buf, len, job->seed, off, &bad) != 0)
            return job_fail(run, -EBADMSG, op, bad,
                            "data read at offset %llu is not what was written there",
                            (unsigned long long)bad);
    }
    qual_hist_record(&s->hist, lat_ns);
    s->bytes += len;
    s->ops++;
    __atomic_add_fetch(&run->ctl->bytes_done, len, __ATOMIC_RELAXED);
    __atomic_add_fetch(&run->ctl->ops_done, 1, __ATOMIC_RELAXED);
    return 0;
}

static int validate(const struct qual_job *job)
{
    if (!job->path || !*job->path)
        return qual_set_error(-EINVAL, "job has no target path");
    if (job->op != QUAL_OP_READ && job->op != QUAL_OP_WRITE)
        return qual_set_error(-EINVAL, "op %d is neither read nor write", job->op);
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

int resolve_backend(int requested, int *chosen)
{
    *chosen = requested;
    if (requested == QUAL_BACKEND_PSYNC)
        return 0;
    int probe = qual_io_uring_probe();
    if (probe == 0)
        *chosen = QUAL_BACKEND_IO_URING;
    else if (requested == QUAL_BACKEND_AUTO)
        *chosen = QUAL_BACKEND_PSYNC;
    else
        return qual_set_error(probe, "io_uring is unavailable here: %s", strerror(-probe));
    return 0;
}

static int open_target(const struct qual_job *job, int *fd_out)
{
    int flags = (job->op == QUAL_OP_WRITE ? O_WRONLY : O_RDONLY) | (job->direct ? O_DIRECT : 0);
    return target_open(job->path, flags, &job->expect, op_name(job->op), fd_out);
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

struct thread_arg {
    struct stream s;
    pthread_t tid;
    int started;
};

static void *stream_main(void *p)
{
    struct thread_arg *ta = p;
    struct stream *s = &ta->s;
    struct jobrun *run = s->run;
    struct ring_state *rs = NULL;
    void *buf = NULL;
    int rc = run->backend == QUAL_BACKEND_IO_URING ? ring_setup(s, &rs) : psync_setup(s, &buf);
    if (rc) {
        job_fail(run, rc, -1, 0, "%s", qual_last_error());
        __atomic_store_n(&run->setup_failed, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_lock(&run->gate);
    run->ready++;
    pthread_cond_broadcast(&run->gate_cv);
    while (!run->open)
        pthread_cond_wait(&run->gate_cv, &run->gate);
    pthread_mutex_unlock(&run->gate);
    if (!__atomic_load_n(&run->setup_failed, __ATOMIC_RELAXED)) {
        if (run->backend == QUAL_BACKEND_IO_URING)
            ring_run(s, rs);
        else
            psync_run(s, buf);
    }
    if (rs)
        ring_teardown(rs);
    free(buf);
    return NULL;
}

void process_cpu(double *user, double *sys)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6;
    *sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
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
    res->error_op = -1;
    int rc = validate(job);
    if (rc)
        goto early;

    int backend;
    rc = resolve_backend(job->backend, &backend);
    if (rc)
        goto early;
    res->backend = backend;

    uint32_t lanes = backend == QUAL_BACKEND_PSYNC ? job->queue_depth : 1;
    uint64_t nthreads = (uint64_t)job->workers * lanes;
    if (nthreads > MAX_THREADS) {
        rc = qual_set_error(-EINVAL, "psync needs workers x depth = %llu threads (max %u)",
                            (unsigned long long)nthreads, MAX_THREADS);
        goto early;
    }

    struct jobrun run;
    memset(&run, 0, sizeof(run));
    run.job = job;
    run.ctl = ctl;
    run.backend = backend;
    run.error_op = -1;
    pthread_mutex_init(&run.lock, NULL);

    struct worker *workers = calloc(job->workers, sizeof(*workers));
    struct thread_arg *threads = calloc(nthreads, sizeof(*threads));
    if (!workers || !threads) {
        free(workers);
        free(threads);
        pthread_mutex_destroy(&run.lock);
        rc = qual_set_error(-ENOMEM, "no memory for %llu threads", (unsigned long long)nthreads);
        goto early;
    }
    split_region(job, workers);
    uint32_t opened = 0;
    for (; opened < job->workers && rc == 0; opened++) {
        workers[opened].run = &run;
        workers[opened].index = opened;
        rc = open_target(job, &workers[opened].fd);
        if (rc == 0 && opened == 0) {
            rc = check_extent(job, workers[0].fd);
            if (rc)
                close(workers[0].fd);
        }
        if (rc)
            break;
    }
    if (rc) {
        for (uint32_t i = 0; i < opened; i++)
            close(workers[i].fd);
        free(workers);
        free(threads);
        pthread_mutex_destroy(&run.lock);
        goto early;
    }

    pthread_mutex_init(&run.gate, NULL);
    pthread_cond_init(&run.gate_cv, NULL);
    uint64_t started = 0;
    for (uint64_t t = 0; t < nthreads; t++) {
        struct thread_arg *ta = &threads[t];
        ta->s.run = &run;
        ta->s.w = &workers[t / lanes];
        ta->s.lane = (unsigned)(t % lanes);
        rng_seed(&ta->s.rng, job->seed ^ mix64(t + 1));
        qual_hist_init(&ta->s.hist);
        int prc = pthread_create(&ta->tid, NULL, stream_main, ta);
        if (prc) {
            job_fail(&run, -prc, -1, 0, "cannot start thread %llu: %s", (unsigned long long)t,
                     strerror(prc));
            __atomic_store_n(&run.setup_failed, 1, __ATOMIC_RELAXED);
            break;
        }
        ta->started = 1;
        started++;
    }
    /* every started stream is set up (ring, buffers) before the clock starts */
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
    pthread_mutex_unlock(&run.gate);
    for (uint64_t t = 0; t < nthreads; t++)
        if (threads[t].started)
            pthread_join(threads[t].tid, NULL);

    if (job->op == QUAL_OP_WRITE && !run.setup_failed) {
        /* durability is part of a write's time: one fdatasync covers every descriptor of the
         * same file or device */
        if (fdatasync(workers[0].fd) != 0)
            job_fail(&run, -errno, QUAL_OP_WRITE, 0, "fdatasync %s: %s", job->path,
                     strerror(errno));
    }
    uint64_t t_end = now_ns();
    double u1, s1;
    process_cpu(&u1, &s1);

    for (uint64_t t = 0; t < nthreads; t++) {
        res->bytes += threads[t].s.bytes;
        res->ops += threads[t].s.ops;
        qual_hist_merge(&res->lat, &threads[t].s.hist);
    }
    res->elapsed_ns = t_end - t_start;
    res->cpu_user_s = u1 - u0;
    res->cpu_sys_s = s1 - s0;
    res->error = run.error;
    res->error_op = run.error_op;
    res->error_offset = run.error_offset;
    memcpy(res->error_msg, run.error_msg, sizeof(res->error_msg));
    if (run.error)
        qual_set_error(run.error, "%s", run.error_msg);

    for (uint32_t i = 0; i < job->workers; i++)
        close(workers[i].fd);
    pthread_cond_destroy(&run.gate_cv);
    pthread_mutex_destroy(&run.gate);
    pthread_mutex_destroy(&run.lock);
    free(workers);
    free(threads);
    return run.error;

early:
    res->error = rc;
    snprintf(res->error_msg, sizeof(res->error_msg), "%s", qual_last_error());
    return rc;
}
