/* kv.c — a KV-cache store's I/O (docs/ARCHITECTURE.md §3): whole entries written to and read
 * from given offsets of one store (a file qual made, or a block device that passed the guard),
 * as an inference server's NVMe tier does when it offloads attention keys and values and reads
 * them back for decode. Each entry goes through the one queue in block_size pieces,
 * queue_depth in flight (from a buffer that may be shorter than the entry and repeat); its
 * latency runs from its first piece handed over to its last piece back. A batch of writes ends with one fdatasync, timed apart, so that a request's entries
 * are durable before it counts as written. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

#define STAMP_UNIT 4096u /* unique writes: each unit of this many bytes carries a stamp */

struct qual_kv {
    struct qual_kv_opts o;
    int backend;
    int fd;
    int stalled;          /* an I/O of the store stalled: its descriptor is never closed */
    uint64_t stamps;      /* unique writes: units stamped so far */
    struct ioq *q;
};

struct batch {
    struct qual_kv *kv;
    int op;
    const struct qual_kv_entry *e;
    uint32_t n;
    uint64_t *first;       /* per entry: when its first piece was handed over */
    uint64_t *last;        /* per entry: when its last piece came back */
    uint32_t cur;          /* the entry being issued */
    uint64_t cur_off;      /* bytes of it issued */
    uint64_t bytes;
    int err;
    uint64_t err_entry;
};

int qual_kv_open(const char *path, const struct qual_kv_opts *o, struct qual_kv **out)
{
    *out = NULL;
    int rc = ioq_check_pieces(o->align, o->block_size, o->queue_depth);
    if (rc)
        return rc;
    struct qual_kv *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return qual_set_error(-ENOMEM, "cannot allocate a KV store");
    kv->o = *o;
    kv->fd = -1;
    rc = resolve_backend(o->backend, &kv->backend);
    if (!rc)
        rc = target_open(path, O_RDWR | (o->direct ? O_DIRECT : 0), NULL, "read and write",
                         &kv->fd);
    if (!rc) {
        struct ioq_opts qo = {
            .backend = kv->backend,
            .fd = kv->fd,
            .depth = o->queue_depth,
            /* entries move straight from (into) the caller's memory; unique writes from
             * each slot's own buffer, stamped as it is handed over */
            .buf_len = o->unique ? o->block_size : 0,
            .deadline_ns = QUAL_UNBOUNDED,
            .stall_ns = o->command_timeout_ns ? o->command_timeout_ns : QUAL_COMMAND_TIMEOUT_NS,
            .faults = o->faults,
            .nfaults = o->nfaults,
        };
        rc = ioq_open(&kv->q, &qo);
        for (uint32_t i = 0; !rc && o->unique && i < o->queue_depth; i++)
            rc = qual_fill_random(ioq_buf(kv->q, i), o->block_size, o->stamp + i);
    }
    if (rc) {
        qual_kv_close(kv);
        return rc;
    }
    *out = kv;
    return 0;
}

int qual_kv_close(struct qual_kv *kv)
{
    if (kv) {
        int wedged = kv->q && ioq_wedged(kv->q);
        ioq_close(kv->q);
        ioq_close_target(kv->fd, kv->stalled);
        if (!wedged)
            free(kv);
    }
    return 0;
}

int qual_kv_backend(const struct qual_kv *kv, int *backend)
{
    *backend = kv->backend;
    return 0;
}

/* Unique writes: every STAMP_UNIT of a piece begins with the run's stamp and the store's next
 * counter, over random bytes, so no unit equals another the store wrote. */
static void stamp(struct qual_kv *kv, unsigned char *buf, uint32_t len)
{
    for (uint32_t at = 0; at + 2 * sizeof(uint64_t) <= len; at += STAMP_UNIT) {
        uint64_t mark[2] = {kv->o.stamp, kv->stamps++};
        memcpy(buf + at, mark, sizeof(mark));
    }
}

static int piece_next(void *ctx, struct ioq_io *io)
{
    struct batch *b = ctx;
    if (b->err || b->cur >= b->n)
        return 0;
    const struct qual_kv_entry *e = &b->e[b->cur];
    uint64_t left = e->len - b->cur_off;
    io->op = b->op;
    io->off = e->offset + b->cur_off;
    io->len = left < b->kv->o.block_size ? (uint32_t)left : b->kv->o.block_size;
    if (b->op == QUAL_OP_WRITE && b->kv->o.unique)
        stamp(b->kv, io->buf, io->len); /* the slot's own buffer: no I/O of it is in flight */
    else
        io->buf = (unsigned char *)e->buf + (e->buf_len ? b->cur_off % e->buf_len : b->cur_off);
    io->tag = b->cur;
    b->cur_off += io->len;
    if (b->cur_off >= e->len) {
        b->cur++;
        b->cur_off = 0;
    }
    return 1;
}

static int piece_done(void *ctx, const struct ioq_io *io, int64_t res, uint64_t lat_ns)
{
    struct batch *b = ctx;
    uint32_t i = (uint32_t)io->tag;
    (void)lat_ns;
    /* the queue has freed the slot (its t_submit is 0 by now): the piece was first handed over
     * at t_first, and came back now */
    uint64_t end = now_ns();
    if (!b->first[i] || io->t_first < b->first[i])
        b->first[i] = io->t_first;
    if (end > b->last[i])
        b->last[i] = end;
    if (res >= 0 && (uint64_t)res == io->len) {
        b->bytes += (uint64_t)res;
        return 0;
    }
    if (!b->err || i < b->err_entry) {
        b->err_entry = i;
        const char *what = b->op == QUAL_OP_WRITE ? "writing" : "reading";
        b->err = res < 0 ? qual_set_error((int)res, "%s %u bytes at offset %llu (entry %u): %s",
                                          what, io->len, (unsigned long long)io->off, i,
                                          strerror((int)-res))
                         : qual_set_error(-EIO, "%s %u bytes at offset %llu (entry %u): short "
                                          "transfer (%lld)", what, io->len,
                                          (unsigned long long)io->off, i, (long long)res);
    }
    return 0; /* what is in flight drains; the lowest failing entry is reported */
}

int qual_kv_run(struct qual_kv *kv, int op, const struct qual_kv_entry *entries, uint32_t n,
                uint64_t *lat_ns, uint64_t *start_ns, struct qual_ctl *ctl,
                struct qual_kv_result *res)
{
    memset(res, 0, sizeof(*res));
    if (op != QUAL_OP_READ && op != QUAL_OP_WRITE)
        return qual_set_error(-EINVAL, "op %d is neither a read nor a write", op);
    if (kv->stalled)
        return qual_set_error(-ETIMEDOUT, "an earlier I/O of the store never came back");
    for (uint32_t i = 0; i < n; i++) {
        const struct qual_kv_entry *e = &entries[i];
        if (!e->len || e->offset % kv->o.align || e->len % kv->o.align ||
            (uintptr_t)e->buf % kv->o.align)
            return qual_set_error(-EINVAL, "entry %u (%llu bytes at offset %llu) is not aligned "
                                  "to %u bytes", i, (unsigned long long)e->len,
                                  (unsigned long long)e->offset, kv->o.align);
        if (e->buf_len && e->buf_len < e->len && e->buf_len % kv->o.block_size)
            return qual_set_error(-EINVAL, "entry %u repeats a buffer of %llu bytes, not a "
                                  "multiple of the block size %u", i,
                                  (unsigned long long)e->buf_len, kv->o.block_size);
        lat_ns[i] = start_ns[i] = 0;
    }
    struct batch b = {.kv = kv, .op = op, .e = entries, .n = n};
    b.first = calloc(n ? n : 1, sizeof(*b.first));
    b.last = calloc(n ? n : 1, sizeof(*b.last));
    int rc = 0;
    if (!b.first || !b.last)
        rc = qual_set_error(-ENOMEM, "cannot allocate %u entries' timings", n);
    uint64_t t0 = now_ns();
    if (!rc) {
        ioq_set_cancel(kv->q, &ctl->cancel);
        struct ioq_client c = {&b, piece_next, piece_done, NULL};
        rc = ioq_run(kv->q, &c);
        if (rc == -ETIMEDOUT)
            kv->stalled = 1;
        if (!rc)
            rc = b.err;
    }
    res->io_ns = now_ns() - t0;
    if (!rc && op == QUAL_OP_WRITE && n) {
        uint64_t s0 = now_ns();
        if (fdatasync(kv->fd) != 0)
            rc = qual_set_error(-errno, "fdatasync of the store: %s", strerror(errno));
        res->sync_ns = now_ns() - s0;
    }
    for (uint32_t i = 0; b.first && b.last && i < n; i++) {
        lat_ns[i] = b.last[i] > b.first[i] ? b.last[i] - b.first[i] : 0;
        start_ns[i] = b.first[i] > t0 ? b.first[i] - t0 : 0;
    }
    res->bytes = b.bytes;
    res->entries = rc ? 0 : n;
    if (!rc) {
        __atomic_add_fetch(&ctl->bytes_done, b.bytes, __ATOMIC_RELAXED);
        __atomic_add_fetch(&ctl->ops_done, n, __ATOMIC_RELAXED);
    }
    free(b.first);
    free(b.last);
    return rc;
}
