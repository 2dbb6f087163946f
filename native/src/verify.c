/* verify.c — data integrity: self-describing verification blocks written over a region and read
 * back, each classified as good, corrupted, foreign, misdirected, stale or unreadable (fio's
 * verify with header fields, after its verify_header: magic, CRC, offset, seed, sequence). One
 * ring keeps queue_depth blocks in flight; psync does one at a time. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

#define MAGIC 0x31425651u /* "QVB1" little-endian */
#define HEADER 32u

struct header {
    uint32_t magic;
    uint32_t crc;
    uint64_t offset;
    uint64_t seed;
    uint64_t seq;
};

static uint32_t block_crc(const unsigned char *p, uint32_t len)
{
    static const uint32_t zero = 0;
    uint32_t c = crc32c(0, p, 4);
    c = crc32c(c, &zero, 4);
    return crc32c(c, p + 8, len - 8);
}

int qual_verify_fill(void *buf, uint32_t block_size, uint64_t offset, uint64_t seed, uint64_t seq)
{
    if (!buf || block_size < 512 || block_size % 512)
        return qual_set_error(-EINVAL, "a verification block is a multiple of 512 bytes");
    unsigned char *p = buf;
    struct header h = {MAGIC, 0, offset, seed, seq};
    memcpy(p, &h, HEADER);
    struct rng r;
    rng_seed(&r, seed ^ mix64(offset) ^ mix64(~seq));
    for (uint32_t at = HEADER; at < block_size; at += 8) {
        uint64_t v = rng_next(&r);
        memcpy(p + at, &v, 8);
    }
    h.crc = block_crc(p, block_size);
    memcpy(p + 4, &h.crc, 4);
    return 0;
}

/* 0 for a good block, else its enum qual_verdict_kind; *h holds what its header says. */
static int classify(const unsigned char *p, const struct qual_verify_opts *o, uint64_t off,
                    struct header *h)
{
    memcpy(h, p, HEADER);
    if (h->magic != MAGIC || h->crc != block_crc(p, o->block_size)) {
        memset(h, 0, sizeof(*h));
        return QUAL_BLOCK_CORRUPTED;
    }
    if (h->seed != o->seed)
        return QUAL_BLOCK_FOREIGN;
    if (h->offset != off)
        return QUAL_BLOCK_MISDIRECTED;
    if (h->seq != o->seq)
        return QUAL_BLOCK_STALE;
    return 0;
}

/* The i-th block of the pass: ascending, or an affine permutation of the n blocks (a
 * multiplier coprime with n visits every block exactly once). */
struct order {
    uint64_t n, mul, add;
};

static uint64_t gcd(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static void order_init(struct order *ord, uint64_t n, int random, uint64_t seed)
{
    ord->n = n;
    ord->mul = 1;
    ord->add = 0;
    if (!random)
        return;
    ord->add = mix64(seed ^ 0x5bd1e995u) % n;
    if (n < 3)
        return; /* 1 is the only multiplier coprime with n below it */
    /* a multiplier in [2, n); n - 1 is coprime with n, so the search ends within n steps */
    uint64_t m = 2 + mix64(seed) % (n - 2);
    while (gcd(m, n) != 1)
        m = m + 1 < n ? m + 1 : 2;
    ord->mul = m;
}

static uint64_t order_at(const struct order *ord, uint64_t i)
{
    return (uint64_t)(((__uint128_t)i * ord->mul + ord->add) % ord->n);
}

struct pass {
    const struct qual_verify_opts *o;
    const char *path;
    struct qual_verify_result *res;
    struct qual_bad_block *bad;
    uint32_t max_report;
    const struct order *ord;
    uint64_t next;            /* the next block of the order to hand to the queue */
    struct qual_ctl *ctl;
};

/* Keep the max_report bad blocks at the lowest offsets: a max-heap on offset while the pass
 * runs (reads complete in any order), sorted when it ends. */
static void sift_down(struct qual_bad_block *b, uint32_t n, uint32_t i)
{
    for (;;) {
        uint32_t big = i, l = 2 * i + 1, r = l + 1;
        if (l < n && b[l].offset > b[big].offset)
            big = l;
        if (r < n && b[r].offset > b[big].offset)
            big = r;
        if (big == i)
            return;
        struct qual_bad_block t = b[i];
        b[i] = b[big];
        b[big] = t;
        i = big;
    }
}

static void report(struct pass *ps, struct qual_bad_block bad)
{
    struct qual_bad_block *b = ps->bad;
    uint32_t n = ps->res->reported;
    if (n < ps->max_report) {
        uint32_t i = n;
        b[i] = bad;
        while (i > 0 && b[(i - 1) / 2].offset < b[i].offset) { /* sift up */
            struct qual_bad_block t = b[i];
            b[i] = b[(i - 1) / 2];
            b[(i - 1) / 2] = t;
            i = (i - 1) / 2;
        }
        ps->res->reported = n + 1;
    } else if (n && bad.offset < b[0].offset) {
        b[0] = bad;
        sift_down(b, n, 0);
    }
}

static int by_offset(const void *a, const void *b)
{
    uint64_t x = ((const struct qual_bad_block *)a)->offset;
    uint64_t y = ((const struct qual_bad_block *)b)->offset;
    return x < y ? -1 : x > y;
}

/* Account one completed block: its result (faults applied) and, for a read, its verdict. */
static int finish(struct pass *ps, unsigned char *buf, uint64_t off, int64_t got)
{
    const struct qual_verify_opts *o = ps->o;
    const int op = o->op;
    const char *what = op == QUAL_OP_WRITE ? "writing" : "reading";
    struct qual_verify_result *res = ps->res;
    if (op == QUAL_OP_READ && (got == -EIO || got == -ENODATA || got == -EILSEQ ||
                               got == -EBADMSG || (got >= 0 && (uint64_t)got < o->block_size))) {
        /* the drive's answer for this block: counted and named, and the check goes on */
        res->blocks++;
        res->unreadable++;
        report(ps, (struct qual_bad_block){off, QUAL_BLOCK_UNREADABLE, 0, 0, 0,
                                           got < 0 ? (int)got : -EIO});
        return 0;
    }
    if (got < 0)
        return qual_set_error((int)got, "%s %u bytes at offset %llu of %s: %s", what,
                              o->block_size, (unsigned long long)off, ps->path,
                              strerror((int)-got));
    if ((uint64_t)got != o->block_size)
        return qual_set_error(-EIO, "%s %u bytes at offset %llu of %s: short %s (%lld)", what,
                              o->block_size, (unsigned long long)off, ps->path,
                              op == QUAL_OP_WRITE ? "write" : "read", (long long)got);
    res->blocks++;
    res->bytes += o->block_size;
    if (op == QUAL_OP_READ) {
        struct header h;
        int kind = classify(buf, o, off, &h);
        if (kind) {
            uint64_t *count[] = {NULL, &res->corrupted, &res->foreign, &res->misdirected,
                                 &res->stale};
            (*count[kind])++;
            report(ps, (struct qual_bad_block){off, kind, h.offset, h.seed, h.seq, 0});
        }
    }
    return 0;
}

static int block_next(void *ctx, struct ioq_io *io)
{
    struct pass *ps = ctx;
    const struct qual_verify_opts *o = ps->o;
    if (ps->next >= ps->ord->n)
        return 0;
    io->op = o->op;
    io->off = o->offset + order_at(ps->ord, ps->next++) * o->block_size;
    io->len = o->block_size;
    if (o->op == QUAL_OP_WRITE)
        qual_verify_fill(io->buf, o->block_size, io->off, o->seed, o->seq);
    return 1;
}

static int block_done(void *ctx, const struct ioq_io *io, int64_t res, uint64_t lat_ns)
{
    (void)lat_ns;
    struct pass *ps = ctx;
    int rc = finish(ps, io->buf, io->off, res);
    if (!rc)
        __atomic_store_n(&ps->ctl->bytes_done, ps->res->bytes, __ATOMIC_RELAXED);
    return rc;
}

int qual_verify_run(const char *path, const struct qual_verify_opts *o, struct qual_ctl *ctl,
                    struct qual_verify_result *res, struct qual_bad_block *bad,
                    uint32_t max_report)
{
    memset(res, 0, sizeof(*res));
    const uint32_t bs = o->block_size;
    if (o->op != QUAL_OP_READ && o->op != QUAL_OP_WRITE)
        return qual_set_error(-EINVAL, "op %d is neither read nor write", o->op);
    if (o->align == 0 || (o->align & (o->align - 1)))
        return qual_set_error(-EINVAL, "alignment %u is not a power of two", o->align);
    if (bs < 512 || bs % 512 || bs % o->align)
        return qual_set_error(-EINVAL, "block size %u is not a multiple of 512 and of the "
                              "alignment %u", bs, o->align);
    if (o->size == 0 || o->size % bs || o->offset % bs)
        return qual_set_error(-EINVAL, "offset %llu and size %llu must be multiples of the "
                              "block size %u, size above 0", (unsigned long long)o->offset,
                              (unsigned long long)o->size, bs);
    if (o->queue_depth == 0 || o->queue_depth > QUAL_MAX_DEPTH)
        return qual_set_error(-EINVAL, "queue depth %u is outside 1..%d", o->queue_depth,
                              QUAL_MAX_DEPTH);
    int rc = resolve_backend(o->backend, &res->backend);
    if (rc)
        return rc;
    int fd;
    rc = target_open(path, (o->op == QUAL_OP_WRITE ? O_WRONLY : O_RDONLY) |
                               (o->direct ? O_DIRECT : 0),
                     &o->expect, o->op == QUAL_OP_WRITE ? "write" : "read", &fd);
    if (rc)
        return rc;
    struct order ord;
    order_init(&ord, o->size / bs, o->random, o->seed ^ o->seq);
    struct pass ps = {o, path, res, bad, bad ? max_report : 0, &ord, 0, ctl};
    struct ioq_opts qo = {
        .backend = res->backend,
        .fd = fd,
        .depth = o->queue_depth,
        .buf_len = bs,
        .align = o->align,
        .submit_batch = 0,
        .deadline_ns = QUAL_UNBOUNDED,
        .stall_ns = QUAL_COMMAND_TIMEOUT_NS,
        .cancel = &ctl->cancel,
        .faults = o->faults,
        .nfaults = o->nfaults,
        .single_issuer = 1,
    };
    uint64_t t0 = now_ns();
    struct ioq_client c = {&ps, block_next, block_done, NULL};
    rc = ioq_run_once(&qo, &c);
    if (!rc && o->op == QUAL_OP_WRITE && fdatasync(fd))
        rc = qual_set_error(-errno, "fdatasync %s: %s", path, strerror(errno));
    res->elapsed_ns = now_ns() - t0;
    ioq_close_target(fd, rc == -ETIMEDOUT);
    if (res->reported)
        qsort(bad, res->reported, sizeof(*bad), by_offset);
    return rc;
}
