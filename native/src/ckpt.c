/* ckpt.c — checkpoint files: caller-owned tensor bytes in chunks, every chunk with its CRC32C,
 * written with several chunks in flight and made durable before the clock stops; restore reads
 * the chunks back and checks every CRC. A chunk inside one aligned span moves straight from
 * (into) its memory; others are packed into (copied out of) aligned staging buffers. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"

struct ckpt_run {
    const struct qual_ckpt_file *f;
    struct qual_ctl *ctl;
    struct qual_ckpt_result *res;
    int fd;
    int op;
    uint64_t nchunks;
    uint64_t next;            /* the next chunk to hand to the queue */
};

static int fail(struct ckpt_run *c, int err, int op, uint64_t off, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int fail(struct ckpt_run *c, int err, int op, uint64_t off, const char *fmt, ...)
{
    if (c->res->error)
        return c->res->error;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->res->error_msg, sizeof(c->res->error_msg), fmt, ap);
    va_end(ap);
    c->res->error = err;
    c->res->error_op = op;
    c->res->error_offset = off;
    qual_set_error(err, "%s", c->res->error_msg);
    return err;
}

static int validate(const struct qual_ckpt_file *f)
{
    if (!f->path || !*f->path)
        return qual_set_error(-EINVAL, "checkpoint file has no path");
    if (f->align == 0 || (f->align & (f->align - 1)))
        return qual_set_error(-EINVAL, "alignment %u is not a power of two", f->align);
    if (f->chunk_size == 0 || f->chunk_size % f->align)
        return qual_set_error(-EINVAL, "chunk size %u is not a multiple of the alignment %u",
                              f->chunk_size, f->align);
    if (f->file_size == 0 || f->file_size % f->align)
        return qual_set_error(-EINVAL, "file size %llu is not a multiple of the alignment %u",
                              (unsigned long long)f->file_size, f->align);
    if (f->queue_depth == 0 || f->queue_depth > 1024)
        return qual_set_error(-EINVAL, "queue depth %u is outside 1..1024", f->queue_depth);
    if (f->backend < QUAL_BACKEND_AUTO || f->backend > QUAL_BACKEND_PSYNC)
        return qual_set_error(-EINVAL, "backend %d is unknown", f->backend);
    uint64_t nchunks = (f->file_size + f->chunk_size - 1) / f->chunk_size;
    if (!f->crcs || f->ncrcs != nchunks)
        return qual_set_error(-EINVAL, "%llu chunks need as many CRC slots, not %u",
                              (unsigned long long)nchunks, f->ncrcs);
    uint64_t end = 0;
    for (uint32_t i = 0; i < f->nspans; i++) {
        const struct qual_span *s = &f->spans[i];
        if (!s->data && s->nbytes)
            return qual_set_error(-EINVAL, "span %u has no memory", i);
        if (s->offset < end)
            return qual_set_error(-EINVAL, "span %u at %llu overlaps or precedes the one before",
                                  i, (unsigned long long)s->offset);
        end = s->offset + s->nbytes;
        if (end > f->file_size)
            return qual_set_error(-EINVAL, "span %u ends at %llu, past the file's %llu bytes", i,
                                  (unsigned long long)end, (unsigned long long)f->file_size);
    }
    if (f->nfaults && !f->faults)
        return qual_set_error(-EINVAL, "fault count without faults");
    return 0;
}

/* The first span that ends after byte lo (spans are sorted and do not overlap). */
static uint32_t first_span(const struct qual_ckpt_file *f, uint64_t lo)
{
    uint32_t a = 0, b = f->nspans;
    while (a < b) {
        uint32_t m = a + (b - a) / 2;
        if (f->spans[m].offset + f->spans[m].nbytes <= lo)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

/* Copy the file image's bytes [lo, hi) into buf (to_file) or out of buf into the spans. */
static void move_chunk(const struct qual_ckpt_file *f, unsigned char *buf, uint64_t lo,
                       uint64_t hi, int to_file)
{
    uint64_t pos = lo;
    for (uint32_t i = first_span(f, lo); i < f->nspans && f->spans[i].offset < hi; i++) {
        const struct qual_span *s = &f->spans[i];
        uint64_t a = s->offset > lo ? s->offset : lo;
        uint64_t b = s->offset + s->nbytes < hi ? s->offset + s->nbytes : hi;
        if (to_file) {
            memset(buf + (pos - lo), 0, a - pos);
            memcpy(buf + (a - lo), (unsigned char *)s->data + (a - s->offset), b - a);
        } else {
            memcpy((unsigned char *)s->data + (a - s->offset), buf + (a - lo), b - a);
        }
        pos = b;
    }
    if (to_file)
        memset(buf + (pos - lo), 0, hi - pos);
}

static uint64_t chunk_len(const struct ckpt_run *c, uint64_t k)
{
    uint64_t lo = k * c->f->chunk_size;
    uint64_t hi = lo + c->f->chunk_size;
    return (hi > c->f->file_size ? c->f->file_size : hi) - lo;
}

/* A chunk is staged in pieces small enough to stay in the CPU's cache, so the CRC reads what
 * the copy just wrote from cache. (Restore checks the whole chunk first, then copies it out:
 * measured faster there, and nothing reaches the spans unchecked.) */
#define PIECE (256u << 10)

/* The span memory holding all of chunk k, if one span does and it is aligned there; else NULL
 * (the chunk is staged). */
static unsigned char *in_place(const struct ckpt_run *c, uint64_t k)
{
    const struct qual_ckpt_file *f = c->f;
    uint64_t lo = k * f->chunk_size, hi = lo + chunk_len(c, k);
    uint32_t i = first_span(f, lo);
    if (i >= f->nspans)
        return NULL;
    const struct qual_span *s = &f->spans[i];
    if (s->offset > lo || s->offset + s->nbytes < hi)
        return NULL;
    unsigned char *p = (unsigned char *)s->data + (lo - s->offset);
    return (uintptr_t)p % f->align ? NULL : p;
}

/* Whether any chunk is staged: when none is, the queue allocates no staging memory (64 MiB
 * at the default depth, faulted in and zeroed by the kernel: a third of a restore's CPU). */
static int needs_staging(const struct ckpt_run *c)
{
    for (uint64_t k = 0; k < c->nchunks; k++)
        if (!in_place(c, k))
            return 1;
    return 0;
}

/* Stage chunk k for writing: fill it and record its CRC. */
static void stage(struct ckpt_run *c, unsigned char *buf, uint64_t k)
{
    uint64_t lo = k * c->f->chunk_size, len = chunk_len(c, k);
    uint32_t crc = 0;
    for (uint64_t at = 0; at < len; at += PIECE) {
        uint64_t n = len - at < PIECE ? len - at : PIECE;
        move_chunk(c->f, buf + at, lo + at, lo + at + n, 1);
        crc = crc32c(crc, buf + at, n);
    }
    c->f->crcs[k] = crc;
}

/* Account a finished chunk I/O: 0, or the failure. A read chunk is checked and copied out. */
static int land(struct ckpt_run *c, int op, unsigned char *buf, uint64_t k, int64_t res)
{
    const struct qual_ckpt_file *f = c->f;
    uint64_t lo = k * f->chunk_size, len = chunk_len(c, k);
    const char *what = op == QUAL_OP_WRITE ? "write" : "read";
    if (res < 0)
        return fail(c, (int)res, op, lo, "%s of checkpoint chunk at offset %llu failed: %s", what,
                    (unsigned long long)lo, strerror((int)-res));
    if ((uint64_t)res != len)
        return fail(c, -EIO, op, lo, "short %s: %lld of %llu bytes at offset %llu", what,
                    (long long)res, (unsigned long long)len, (unsigned long long)lo);
    int direct = buf == in_place(c, k); /* moved in place, no staging buffer */
    if (op == QUAL_OP_READ) {
        uint32_t got = crc32c(0, buf, len);
        if (got != f->crcs[k])
            return fail(c, -EBADMSG, op, lo,
                        "checkpoint bytes %llu..%llu fail their CRC32C (stored %08x, read %08x)",
                        (unsigned long long)lo, (unsigned long long)(lo + len), f->crcs[k], got);
        if (!direct)
            move_chunk(f, buf, lo, lo + len, 0);
    }
    c->res->bytes += len;
    c->res->zero_copy_bytes += direct ? len : 0;
    __atomic_add_fetch(&c->ctl->bytes_done, len, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->ctl->ops_done, 1, __ATOMIC_RELAXED);
    return 0;
}

/* The queue asks for the next chunk: staged for a write, an empty buffer for a read. */
static int chunk_next(void *ctx, struct ioq_io *io)
{
    struct ckpt_run *c = ctx;
    if (c->next >= c->nchunks)
        return 0;
    uint64_t k = c->next++;
    unsigned char *mem = in_place(c, k);
    if (mem) { /* no copy: the kernel moves the span's own bytes */
        io->buf = mem;
        if (c->op == QUAL_OP_WRITE)
            c->f->crcs[k] = crc32c(0, mem, chunk_len(c, k));
    } else if (c->op == QUAL_OP_WRITE) {
        stage(c, io->buf, k);
    }
    io->op = c->op;
    io->off = k * c->f->chunk_size;
    io->len = (uint32_t)chunk_len(c, k);
    io->tag = k;
    return 1;
}

static int chunk_done(void *ctx, const struct ioq_io *io, int64_t res, uint64_t lat_ns)
{
    (void)lat_ns;
    return land(ctx, io->op, io->buf, io->tag, res);
}

/* Every chunk through the queue: up to queue_depth in flight, each handed to the kernel as
 * soon as it is staged, so the device works while the next one is filled. */
static void run_queue(struct ckpt_run *c, int backend)
{
    const struct qual_ckpt_file *f = c->f;
    struct ioq_opts o = {
        .backend = backend,
        .fd = c->fd,
        .depth = f->queue_depth < c->nchunks ? f->queue_depth : (unsigned)c->nchunks,
        .buf_len = needs_staging(c) ? f->chunk_size : 0,
        .align = f->align,
        .submit_batch = 1,
        .deadline_ns = QUAL_UNBOUNDED,
        .stall_ns = QUAL_COMMAND_TIMEOUT_NS,
        .cancel = &c->ctl->cancel,
        .faults = f->faults,
        .nfaults = f->nfaults,
        .single_issuer = 1,
    };
    struct ioq_client cl = {c, chunk_next, chunk_done, NULL};
    int rc = ioq_run_once(&o, &cl);
    if (rc)
        fail(c, rc, c->res->error_op, 0, "%s", qual_last_error());
}

static int run(const struct qual_ckpt_file *f, struct qual_ctl *ctl,
               struct qual_ckpt_result *res, int op)
{
    if (!f || !ctl || !res)
        return qual_set_error(-EINVAL, "file, ctl or result is NULL");
    memset(res, 0, sizeof(*res));
    res->error_op = -1;
    struct ckpt_run c = {f, ctl, res, -1, op, 0, 0};
    int rc = validate(f);
    if (rc)
        return fail(&c, rc, -1, 0, "%s", qual_last_error());
    c.nchunks = (f->file_size + f->chunk_size - 1) / f->chunk_size;

    int backend;
    rc = resolve_backend(f->backend, &backend);
    if (rc)
        return fail(&c, rc, -1, 0, "%s", qual_last_error());
    res->backend = backend;

    double u0, s0, u1, s1;
    process_cpu(&u0, &s0);
    uint64_t t0 = now_ns();
    int flags = O_CLOEXEC | (f->direct ? O_DIRECT : 0);
    flags |= op == QUAL_OP_WRITE ? O_WRONLY | O_CREAT | O_EXCL : O_RDONLY;
    c.fd = open(f->path, flags, 0644);
    if (c.fd < 0) {
        int err = errno;
        return fail(&c, -err, op, 0, "open %s: %s", f->path, strerror(err));
    }
    if (op == QUAL_OP_WRITE) {
        /* the whole file's space up front: a full target fails here, before any data moves */
        rc = posix_fallocate(c.fd, 0, (off_t)f->file_size);
        if (rc && rc != EOPNOTSUPP && rc != EINVAL)
            fail(&c, -rc, op, 0, "no room for a %llu-byte checkpoint file %s: %s",
                 (unsigned long long)f->file_size, f->path, strerror(rc));
    } else {
        struct stat st;
        if (fstat(c.fd, &st) != 0)
            fail(&c, -errno, op, 0, "stat %s: %s", f->path, strerror(errno));
        else if ((uint64_t)st.st_size != f->file_size)
            fail(&c, -EBADMSG, op, 0, "%s holds %lld bytes, the manifest says %llu", f->path,
                 (long long)st.st_size, (unsigned long long)f->file_size);
    }
    if (!res->error) {
        c.op = op;
        run_queue(&c, backend);
    }
    if (op == QUAL_OP_WRITE && !res->error) {
        uint64_t ts = now_ns();
        if (fdatasync(c.fd) != 0)
            fail(&c, -errno, op, 0, "fdatasync %s: %s", f->path, strerror(errno));
        res->sync_ns = now_ns() - ts;
    }
    ioq_close_target(c.fd, res->error == -ETIMEDOUT);
    res->elapsed_ns = now_ns() - t0;
    process_cpu(&u1, &s1);
    res->cpu_user_s = u1 - u0;
    res->cpu_sys_s = s1 - s0;
    return res->error;
}

int qual_ckpt_write(const struct qual_ckpt_file *f, struct qual_ctl *ctl,
                    struct qual_ckpt_result *res)
{
    return run(f, ctl, res, QUAL_OP_WRITE);
}

int qual_ckpt_read(const struct qual_ckpt_file *f, struct qual_ctl *ctl,
                   struct qual_ckpt_result *res)
{
    return run(f, ctl, res, QUAL_OP_READ);
}
