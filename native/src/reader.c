/* reader.c — whole-file reads as a training data loader's read thread does them (DLIO's
 * on-demand reader: open the sample file, read all of it, close). The bytes land in a reused
 * set of block buffers and are not passed on: what a simulated accelerator needs is the time
 * the read took. io_uring keeps queue_depth blocks of the file in flight; psync reads them one
 * after another. */
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
    struct ring *ring;  /* io_uring: made with the first file, then pointed at each next one */
    void *buf;          /* psync: one block */
};

int qual_reader_open(const struct qual_reader_opts *o, struct qual_reader **out)
{
    *out = NULL;
    if (o->align == 0 || (o->align & (o->align - 1)))
        return qual_set_error(-EINVAL, "alignment %u is not a power of two", o->align);
    if (o->block_size == 0 || o->block_size % o->align)
        return qual_set_error(-EINVAL, "block size %u is not a multiple of the alignment %u",
                              o->block_size, o->align);
    if (o->queue_depth == 0 || o->queue_depth > 4096)
        return qual_set_error(-EINVAL, "queue depth %u is outside 1..4096", o->queue_depth);
    struct qual_reader *r = calloc(1, sizeof(*r));
    if (!r)
        return qual_set_error(-ENOMEM, "cannot allocate a reader");
    r->o = *o;
    int rc = resolve_backend(o->backend, &r->backend);
    if (!rc && r->backend == QUAL_BACKEND_PSYNC) {
        rc = -posix_memalign(&r->buf, o->align < 4096 ? 4096 : o->align, o->block_size);
        if (rc)
            rc = qual_set_error(rc, "cannot allocate a %u-byte buffer", o->block_size);
    }
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
        ring_close(r->ring);
        free(r->buf);
        free(r);
    }
    return 0;
}

int qual_reader_backend(const struct qual_reader *r, int *backend)
{
    *backend = r->backend;
    return 0;
}

/* One block's result, faults applied: bytes read, or -errno (recording why when `report`). */
static int64_t finish_block(struct qual_reader *r, const char *path, uint64_t off, uint32_t len,
                            int64_t res, uint64_t size, int report)
{
    uint64_t delay = 0;
    res = fault_apply(r->o.faults, r->o.nfaults, QUAL_OP_READ, off, len, res, &delay);
    if (delay)
        fault_delay(delay);
    uint64_t want = size - off < len ? size - off : len; /* the file ends inside the last block */
    if (res < 0 && !report)
        return res;
    if ((uint64_t)res != want && !report)
        return -EIO;
    if (res < 0)
        return qual_set_error((int)res, "reading %u bytes at offset %llu of %s: %s", len,
                              (unsigned long long)off, path, strerror((int)-res));
    if ((uint64_t)res != want)
        return qual_set_error(-EIO, "reading %u bytes at offset %llu of %s: short read (%lld)",
                              len, (unsigned long long)off, path, (long long)res);
    return res;
}

static int read_ring(struct qual_reader *r, int fd, const char *path, uint64_t size,
                     struct qual_ctl *ctl, uint64_t *bytes)
{
    const uint32_t bs = r->o.block_size, align = r->o.align;
    int rc;
    if (!r->ring) {
        rc = ring_open(&r->ring, fd, r->o.queue_depth, bs, align, 0);
        if (rc) {
            ring_close(r->ring);
            r->ring = NULL;
            return rc;
        }
    } else if ((rc = ring_set_file(r->ring, fd)) != 0) {
        return rc;
    }
    uint64_t *slot_off = calloc(r->o.queue_depth, sizeof(*slot_off));
    unsigned *free_slots = calloc(r->o.queue_depth, sizeof(*free_slots));
    if (!slot_off || !free_slots) {
        free(slot_off);
        free(free_slots);
        return qual_set_error(-ENOMEM, "cannot allocate %u slots", r->o.queue_depth);
    }
    unsigned nfree = r->o.queue_depth, inflight = 0;
    for (unsigned i = 0; i < nfree; i++)
        free_slots[i] = i;
    uint64_t next = 0, err_off = UINT64_MAX; /* the lowest failing offset is the one reported */
    int wait_only = 0;
    rc = 0;
    for (;;) {
        while (!rc && next < size && nfree) {
            uint64_t left = size - next;
            /* O_DIRECT lengths are aligned: the last block asks past the end, gets the rest */
            uint32_t len = left < bs ? (uint32_t)((left + align - 1) / align * align) : bs;
            unsigned slot = free_slots[--nfree];
            slot_off[slot] = next;
            ring_queue(r->ring, QUAL_OP_READ, slot, next, len);
            inflight++;
            next += len;
        }
        if (inflight == 0 || (wait_only && inflight == ring_pending(r->ring)))
            break;
        int src = wait_only ? ring_wait(r->ring) : ring_submit(r->ring, 1);
        if (src) {
            if (!rc) {
                rc = src;
                err_off = 0; /* the ring's own error is the one reported */
            }
            wait_only = 1;  /* nothing more goes in; what the kernel holds must come back */
        }
        uint64_t ud;
        int32_t res;
        while (ring_reap(r->ring, &ud, &res)) {
            inflight--;
            free_slots[nfree++] = (unsigned)ud;
            uint64_t off = slot_off[ud];
            uint32_t len = size - off < bs ? (uint32_t)((size - off + align - 1) / align * align) : bs;
            int64_t got = finish_block(r, path, off, len, res, size, off < err_off);
            if (got < 0 && off < err_off) {
                rc = (int)got;
                err_off = off;
            } else if (got >= 0)
                *bytes += (uint64_t)got;
        }
        if (!rc && __atomic_load_n(&ctl->cancel, __ATOMIC_RELAXED)) {
            rc = qual_set_error(-ECANCELED, "cancelled");
            err_off = 0;
        }
        if (rc)
            next = size; /* queue nothing more; drain what is in flight */
    }
    if (inflight)
        r->ring = NULL; /* the kernel may still write into its buffers: leave them be */
    free(slot_off);
    free(free_slots);
    return rc;
}

static int read_psync(struct qual_reader *r, int fd, const char *path, uint64_t size,
                      struct qual_ctl *ctl, uint64_t *bytes)
{
    const uint32_t bs = r->o.block_size, align = r->o.align;
    for (uint64_t off = 0; off < size; off += bs) {
        if (__atomic_load_n(&ctl->cancel, __ATOMIC_RELAXED))
            return qual_set_error(-ECANCELED, "cancelled");
        uint32_t len = size - off < bs ? (uint32_t)((size - off + align - 1) / align * align) : bs;
        ssize_t n;
        do {
            n = pread(fd, r->buf, len, (off_t)off);
        } while (n < 0 && errno == EINTR);
        int64_t got = finish_block(r, path, off, len, n < 0 ? -errno : n, size, 1);
        if (got < 0)
            return (int)got;
        *bytes += (uint64_t)got;
    }
    return 0;
}

int qual_reader_read(struct qual_reader *r, const char *path, struct qual_ctl *ctl,
                     uint64_t *bytes)
{
    *bytes = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | (r->o.direct ? O_DIRECT : 0));
    if (fd < 0) {
        int err = errno;
        if (err == EINVAL && r->o.direct)
            return qual_set_error(-EINVAL, "%s does not support O_DIRECT", path);
        return qual_set_error(-err, "open %s for reading: %s", path, strerror(err));
    }
    struct stat st;
    int rc = fstat(fd, &st) ? qual_set_error(-errno, "stat %s: %s", path, strerror(errno)) : 0;
    if (!rc) {
        uint64_t size = (uint64_t)st.st_size;
        rc = r->backend == QUAL_BACKEND_IO_URING ? read_ring(r, fd, path, size, ctl, bytes)
                                                 : read_psync(r, fd, path, size, ctl, bytes);
    }
    close(fd);
    if (!rc) {
        __atomic_add_fetch(&ctl->bytes_done, *bytes, __ATOMIC_RELAXED);
        __atomic_add_fetch(&ctl->ops_done, 1, __ATOMIC_RELAXED);
    }
    return rc;
}
