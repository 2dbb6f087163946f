/* psync.c — the pread/pwrite backend: each worker is served by queue_depth threads doing
 * synchronous I/O, so the device sees the same number of requests in flight as with a ring. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

int psync_setup(struct stream *s, void **out)
{
    const struct qual_job *job = s->run->job;
    size_t align = job->align > 4096 ? job->align : 4096;
    void *buf = NULL;
    int rc = posix_memalign(&buf, align, job->block_size);
    if (rc)
        return qual_set_error(-rc, "cannot allocate a %u-byte I/O buffer", job->block_size);
    if (job->op == QUAL_OP_WRITE)
        qual_fill_random(buf, job->block_size,
                         job->seed ^ mix64(((uint64_t)s->w->index << 32) + s->lane + 1));
    else
        memset(buf, 0, job->block_size);
    *out = buf;
    return 0;
}

int psync_run(struct stream *s, void *buf)
{
    const struct qual_job *job = s->run->job;
    const int fd = s->w->fd;
    const size_t len = job->block_size;
    uint64_t off;

    while (job_claim(s, &off)) {
        if (job->op == QUAL_OP_WRITE)
            job_prepare_write(s, buf, off);
        uint64_t t0 = now_ns();
        ssize_t n;
        do {
            n = job->op == QUAL_OP_WRITE ? pwrite(fd, buf, len, (off_t)off)
                                         : pread(fd, buf, len, (off_t)off);
        } while (n < 0 && errno == EINTR);
        uint64_t t1 = now_ns();
        if (job_complete(s, job->op, off, n < 0 ? -(int64_t)errno : (int64_t)n, t1 - t0, buf))
            break;
    }
    return 0;
}
