/* reader.c — sample-file reads as a training data loader's read thread does them (DLIO's
 * on-demand reader: open the sample file, read all of it, close; or, for a columnar file, only
 * the chunks of the columns it wants). The bytes land in a reused set of block buffers and are
 * not passed on: what a simulated accelerator needs is the time the read took. io_uring keeps
 * queue_depth blocks of the file in flight; psync reads them one after another. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"

struct qual_reader {
    struct qual_reader_opts o;
    int backend;
    struct ioq *q;      /* made with the first file, then pointed at each next one */
    /* the file being read */
    const char *path;
    uint64_t size;
    const struct qual_range *ranges; /* what to read of it, in order */
    uint32_t nranges, range;         /* how many; the one being handed to the queue */
    uint64_t next;      /* the next offset to hand to the queue */
    uint64_t bytes;
    uint64_t err_off;   /* the lowest failing offset is the one reported */
    int err;
};

int qual_reader_open(const struct qual_reader_opts *o, struct qual_reader **out)
{
    *out = NULL;
    int rc = ioq_check_pieces(o->align, o->block_size, o->queue_depth);
    if (rc)
        return rc;
    struct qual_reader *r = calloc(1, sizeof(*r));
    if (!r)
        return qual_set_error(-ENOMEM, "cannot allocate a reader");
    r->o = *o;
    rc = resolve_backend(o->backend, &r->backend);
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int qual_reader_close(struct qual_reader *r)
{
    if (r) {
        int wedged = r->q && ioq_wedged(r->q);
        ioq_close(r->q);
        if (!wedged)
            free(r);
    }
    return 0;
}

int qual_reader_backend(const struct qual_reader *r, int *backend)
{
    *backend = r->backend;
    return 0;
}

/* The next block of the ranges, up to the end of its range (O_DIRECT lengths are aligned: a
 * range that ends past the file's end gets the rest). */
static int block_next(void *ctx, struct ioq_io *io)
{
    struct qual_reader *r = ctx;
    while (r->range < r->nranges &&
           r->next >= r->ranges[r->range].offset + r->ranges[r->range].nbytes) {
        if (++r->range < r->nranges)
            r->next = r->ranges[r->range].offset;
    }
    if (r->err || r->range >= r->nranges || r->next >= r->size)
        return 0;
    uint64_t left = r->ranges[r->range].offset + r->ranges[r->range].nbytes - r->next;
    io->op = QUAL_OP_READ;
    io->off = r->next;
    io->len = left < r->o.block_size ? (uint32_t)left : r->o.block_size;
    r->next += io->len;
    return 1;
}

/* One block's result: every byte the file has there, or the error of the lowest offset. */
static int block_done(void *ctx, const struct ioq_io *io, int64_t res, uint64_t lat_ns)
{
    (void)lat_ns;
    struct qual_reader *r = ctx;
    uint64_t want = r->size - io->off < io->len ? r->size - io->off : io->len;
    if (res >= 0 && (uint64_t)res == want) {
        r->bytes += (uint64_t)res;
        return 0;
    }
    if (io->off < r->err_off) {
        r->err_off = io->off;
        r->err = res < 0 ? qual_set_error((int)res, "reading %u bytes at offset %llu of %s: %s",
                                          io->len, (unsigned long long)io->off, r->path,
                                          strerror((int)-res))
                         : qual_set_error(-EIO, "reading %u bytes at offset %llu of %s: short "
                                          "read (%lld)", io->len, (unsigned long long)io->off,
                                          r->path, (long long)res);
    }
    return 0; /* the rest drains; the lowest failing offset wins */
}

static int read_file(struct qual_reader *r, const char *path, const struct qual_range *ranges,
                     uint32_t nranges, struct qual_ctl *ctl, uint64_t *bytes)
{
    *bytes = 0;
    uint64_t mask = r->o.align - 1;
    for (uint32_t i = 0; i < nranges; i++) {
        if ((ranges[i].offset | ranges[i].nbytes) & mask || !ranges[i].nbytes ||
            (i && ranges[i].offset < ranges[i - 1].offset + ranges[i - 1].nbytes))
            return qual_set_error(-EINVAL, "range %u (%llu bytes at %llu) is empty, unaligned "
                                  "to %u or out of order", i,
                                  (unsigned long long)ranges[i].nbytes,
                                  (unsigned long long)ranges[i].offset, r->o.align);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | (r->o.direct ? O_DIRECT : 0));
    if (fd < 0) {
        int err = errno;
        if (err == EINVAL && r->o.direct)
            return qual_set_error(-EINVAL, "%s does not support O_DIRECT", path);
        return qual_set_error(-err, "open %s for reading: %s", path, strerror(err));
    }
    struct stat st;
    int rc = fstat(fd, &st) ? qual_set_error(-errno, "stat %s: %s", path, strerror(errno)) : 0;
    if (!rc && !r->q) {
        struct ioq_opts o = {
            .backend = r->backend,
            .fd = fd,
            .depth = r->o.queue_depth,
            .buf_len = r->o.block_size,
            .align = r->o.align,
            .submit_batch = 0,
            .deadline_ns = QUAL_UNBOUNDED,
            .stall_ns = QUAL_COMMAND_TIMEOUT_NS,
            .cancel = &ctl->cancel,
            .faults = r->o.faults,
            .nfaults = r->o.nfaults,
        };
        rc = ioq_open(&r->q, &o);
    } else if (!rc) {
        rc = ioq_set_fd(r->q, fd);
        ioq_set_cancel(r->q, &ctl->cancel);
    }
    if (!rc) {
        /* the whole file: one range over it, its end rounded up to the alignment */
        struct qual_range whole = {0, ((uint64_t)st.st_size + mask) & ~mask};
        r->path = path;
        r->size = (uint64_t)st.st_size;
        r->ranges = ranges ? ranges : &whole;
        r->nranges = ranges ? nranges : 1;
        r->range = 0;
        r->next = r->nranges ? r->ranges[0].offset : 0;
        r->bytes = 0;
        r->err_off = UINT64_MAX;
        r->err = 0;
        struct ioq_client c = {r, block_next, block_done, NULL};
        rc = ioq_run(r->q, &c);
        if (!rc)
            rc = r->err;
        *bytes = r->bytes;
        r->ranges = NULL;
    }
    ioq_close_target(fd, rc == -ETIMEDOUT);
    if (!rc) {
        __atomic_add_fetch(&ctl->bytes_done, *bytes, __ATOMIC_RELAXED);
        __atomic_add_fetch(&ctl->ops_done, 1, __ATOMIC_RELAXED);
    }
    return rc;
}

int qual_reader_read(struct qual_reader *r, const char *path, struct qual_ctl *ctl,
                     uint64_t *bytes)
{
    return read_file(r, path, NULL, 0, ctl, bytes);
}

int qual_reader_read_ranges(struct qual_reader *r, const char *path,
                            const struct qual_range *ranges, uint32_t nranges,
                            struct qual_ctl *ctl, uint64_t *bytes)
{
    if (!ranges) /* NULL means the whole file to read_file */
        return qual_set_error(-EINVAL, "ranges is NULL");
    return read_file(r, path, ranges, nranges, ctl, bytes);
}
