/* cache.c — the feature cache's pages and slots: open and close, clock eviction, window pins,
 * the CPU buffer of hot rows, what a gather would read, and the counters. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fcache.h"

int qual_fcache_close(struct qual_fcache *c)
{
    if (!c)
        return 0;
    int wedged = c->q && ioq_wedged(c->q);
    ioq_close(c->q);
    ioq_close_target(c->fd, wedged);
    if (wedged)
        return 0; /* the kernel still reads into the cache's memory: leave all of it be */
    free(c->path);
    free(c->slot_of);
    free(c->window);
    free(c->cpu_row);
    io_memory_free(c->mem, c->o.capacity * c->o.page_size);
    free(c->slot_page);
    free(c->refs);
    free(c->recent);
    free(c->loading);
    free(c->iov);
    free(c->gather_slots);
    free(c);
    return 0;
}

static int validate(const struct qual_fcache_opts *o)
{
    if (!o->path || !*o->path)
        return qual_set_error(-EINVAL, "feature store has no path");
    if (o->page_size < 512 || (o->page_size & (o->page_size - 1)))
        return qual_set_error(-EINVAL, "page size %u is not a power of two of 512 or more",
                              o->page_size);
    if (o->row_bytes == 0 || o->row_stride < o->row_bytes || o->row_stride % o->page_size)
        return qual_set_error(-EINVAL, "row stride %u must hold a %u-byte row in whole %u-byte "
                              "pages", o->row_stride, o->row_bytes, o->page_size);
    if (o->rows == 0 || o->capacity == 0 || o->capacity >= NO_SLOT)
        return qual_set_error(-EINVAL, "a cache needs rows and 1..%u pages", NO_SLOT - 1);
    if (o->queue_depth == 0 || o->queue_depth > QUAL_MAX_DEPTH)
        return qual_set_error(-EINVAL, "queue depth %u is outside 1..%d", o->queue_depth,
                              QUAL_MAX_DEPTH);
    if (o->max_coalesce == 0 || o->max_coalesce > 1024) /* readv takes 1024 vectors at most */
        return qual_set_error(-EINVAL, "coalescing %u pages is outside 1..1024", o->max_coalesce);
    return 0;
}

int fcache_queue(struct qual_fcache *c)
{
    pid_t me = gettid();
    if (c->q && c->q_owner == me)
        return 0;
    if (c->q && ioq_wedged(c->q))
        return qual_set_error(-EIO, "an earlier read of %s never came back: the cache cannot "
                              "read again", c->path);
    ioq_close(c->q);
    c->q = NULL;
    struct ioq_opts qo = {
        .backend = c->backend,
        .fd = c->fd,
        .depth = c->o.queue_depth,
        .buf_len = 0, /* reads land in the cache's slots */
        .client_mem = c->mem,
        .client_mem_len = c->o.capacity * c->o.page_size,
        .submit_batch = 0,
        .wait_batch = 8, /* no latency is measured: fewer, fuller waits */
        .deadline_ns = QUAL_UNBOUNDED,
        .stall_ns = QUAL_COMMAND_TIMEOUT_NS,
        .single_issuer = 1,
    };
    int rc = ioq_open(&c->q, &qo);
    if (!rc)
        c->q_owner = me;
    return rc;
}

int qual_fcache_open(const struct qual_fcache_opts *o, struct qual_fcache **out)
{
    if (!o || !out)
        return qual_set_error(-EINVAL, "options or output is NULL");
    int rc = validate(o);
    if (rc)
        return rc;
    struct qual_fcache *c = calloc(1, sizeof(*c));
    if (!c)
        return qual_set_error(-ENOMEM, "no memory for a cache");
    c->o = *o;
    c->fd = -1;
    c->path = strdup(o->path);
    c->o.path = c->path;
    c->row_pages = o->row_stride / o->page_size;
    c->pages = o->rows * c->row_pages;
    c->fd = open(o->path, O_RDONLY | O_CLOEXEC | (o->direct ? O_DIRECT : 0));
    if (c->fd < 0) {
        rc = qual_set_error(-errno, "open %s: %s", o->path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(c->fd, &st) != 0 || (uint64_t)st.st_size < c->pages * o->page_size) {
        rc = qual_set_error(-EINVAL, "%s holds %lld bytes, not the %llu that %llu rows of %u need",
                            o->path, (long long)st.st_size,
                            (unsigned long long)(c->pages * o->page_size),
                            (unsigned long long)o->rows, o->row_stride);
        goto fail;
    }
    c->slot_of = malloc(c->pages * sizeof(*c->slot_of));
    c->window = calloc(c->pages, sizeof(*c->window));
    c->slot_page = malloc(o->capacity * sizeof(*c->slot_page));
    c->refs = calloc(o->capacity, sizeof(*c->refs));
    c->recent = calloc(o->capacity, 1);
    c->loading = calloc(o->capacity, 1);
    c->iov = malloc((size_t)o->queue_depth * o->max_coalesce * sizeof(*c->iov));
    c->mem = io_memory_alloc(o->capacity * o->page_size, o->page_size);
    if (!c->slot_of || !c->window || !c->slot_page || !c->refs || !c->recent || !c->loading ||
        !c->iov || !c->mem) {
        rc = qual_set_error(-ENOMEM, "no memory for a %llu-page cache over %llu pages",
                            (unsigned long long)o->capacity, (unsigned long long)c->pages);
        goto fail;
    }
    memset(c->slot_of, 0xff, c->pages * sizeof(*c->slot_of));
    for (uint64_t s = 0; s < o->capacity; s++)
        c->slot_page[s] = -1;
    rc = resolve_backend(o->backend, &c->backend);
    if (rc)
        goto fail;
    *out = c;
    return 0;
fail:
    qual_fcache_close(c);
    return rc;
}

/* How far the clock looks for a page nobody wants before it settles for a pinned one: a
 * bound, so that a cache full of pinned pages costs a few probes per miss, not a sweep. */
#define VICTIM_PROBES 1024u

int fcache_victim(struct qual_fcache *c, uint32_t *slot)
{
    uint64_t cap = c->o.capacity;
    uint64_t probes = 2 * cap + 1 < VICTIM_PROBES ? 2 * cap + 1 : VICTIM_PROBES;
    for (uint64_t n = 0; n < probes; n++) {
        uint64_t s = c->hand;
        c->hand = (c->hand + 1) % cap;
        int64_t p = c->slot_page[s];
        if (p < 0) {
            *slot = (uint32_t)s;
            return 0;
        }
        if (c->refs[s] || c->window[p])
            continue; /* in use now, or wanted by a batch sampled ahead */
        if (c->recent[s]) {
            c->recent[s] = 0;
            continue;
        }
        c->slot_of[p] = NO_SLOT;
        c->slot_page[s] = -1;
        c->st.evictions++;
        *slot = (uint32_t)s;
        return 0;
    }
    /* Window pins are a preference (GIDS's window-aware search gives up on them after a while
     * too): when the probes found no page nobody wants, the next one not held by this gather
     * goes, pinned or not. */
    for (uint64_t n = 0; n < cap; n++) {
        uint64_t s = c->hand;
        c->hand = (c->hand + 1) % cap;
        if (c->refs[s])
            continue;
        int64_t p = c->slot_page[s];
        if (p >= 0) {
            c->st.evictions++;
            c->st.pinned_evictions += c->window[p] > 0;
            c->slot_of[p] = NO_SLOT;
        }
        c->slot_page[s] = -1;
        *slot = (uint32_t)s;
        return 0;
    }
    return -EBUSY;
}

static int check_rows(const struct qual_fcache *c, const int64_t *rows, uint64_t n)
{
    if (!rows && n)
        return qual_set_error(-EINVAL, "rows is NULL");
    for (uint64_t i = 0; i < n; i++)
        if (rows[i] < 0 || (uint64_t)rows[i] >= c->o.rows)
            return qual_set_error(-EINVAL, "row %lld is outside the store's %llu rows",
                                  (long long)rows[i], (unsigned long long)c->o.rows);
    return 0;
}

int qual_fcache_window(struct qual_fcache *c, const int64_t *rows, uint64_t n, int delta)
{
    if (!c || (delta != 1 && delta != -1))
        return qual_set_error(-EINVAL, "window delta must be +1 or -1");
    int rc = check_rows(c, rows, n);
    if (rc)
        return rc;
    for (uint64_t i = 0; i < n; i++) {
        for (uint32_t k = 0; k < c->row_pages; k++) {
            uint64_t p = (uint64_t)rows[i] * c->row_pages + k;
            if (delta > 0) {
                if (c->window[p] == UINT16_MAX)
                    return qual_set_error(-EOVERFLOW, "page %llu is pinned 65535 times",
                                          (unsigned long long)p);
                if (c->window[p]++ == 0)
                    c->st.pinned_pages++;
            } else {
                if (c->window[p] == 0)
                    return qual_set_error(-EINVAL, "page %llu was not pinned",
                                          (unsigned long long)p);
                if (--c->window[p] == 0)
                    c->st.pinned_pages--;
            }
        }
    }
    return 0;
}

/* Filling the CPU buffer: row i of the list is read whole into a queue buffer, and its
 * bytes copied to buffer row i. */
struct cpu_fill {
    struct qual_fcache *c;
    const int64_t *rows;
    uint64_t n;
    unsigned char *buffer;
    uint64_t next;
};

static int cpu_fill_next(void *ctx, struct ioq_io *io)
{
    struct cpu_fill *f = ctx;
    if (f->next >= f->n)
        return 0;
    io->op = QUAL_OP_READ;
    io->off = (uint64_t)f->rows[f->next] * f->c->o.row_stride;
    io->len = f->c->o.row_stride;
    io->tag = f->next++;
    return 1;
}

static int cpu_fill_done(void *ctx, const struct ioq_io *io, int64_t res, uint64_t lat_ns)
{
    (void)lat_ns;
    struct cpu_fill *f = ctx;
    if (res != (int64_t)io->len)
        return qual_set_error(res < 0 ? (int)res : -EIO, "reading row %lld for the CPU buffer: "
                              "%s", (long long)f->rows[io->tag],
                              res < 0 ? strerror((int)-res) : "short read");
    memcpy(f->buffer + io->tag * f->c->o.row_bytes, io->buf, f->c->o.row_bytes);
    return 0;
}

int qual_fcache_set_cpu_buffer(struct qual_fcache *c, const int64_t *rows, uint64_t n,
                               void *buffer)
{
    if (!c || (!buffer && n))
        return qual_set_error(-EINVAL, "cache or buffer is NULL");
    int rc = check_rows(c, rows, n);
    if (rc)
        return rc;
    if (!c->cpu_row) {
        c->cpu_row = malloc(c->o.rows * sizeof(*c->cpu_row));
        if (!c->cpu_row)
            return qual_set_error(-ENOMEM, "no memory for the CPU buffer's index");
    }
    memset(c->cpu_row, 0xff, c->o.rows * sizeof(*c->cpu_row));
    c->cpu_buf = NULL;
    /* fill it from the store directly, not through the cache (no cache pages, no counters) */
    struct cpu_fill f = {c, rows, n, buffer, 0};
    struct ioq_opts qo = {
        .backend = c->backend,
        .fd = c->fd,
        .depth = c->o.queue_depth,
        .buf_len = c->o.row_stride,
        .align = c->o.page_size,
        .submit_batch = 0,
        .deadline_ns = QUAL_UNBOUNDED,
        .stall_ns = QUAL_COMMAND_TIMEOUT_NS,
        .single_issuer = 1,
    };
    struct ioq_client cl = {&f, cpu_fill_next, cpu_fill_done, NULL};
    rc = ioq_run_once(&qo, &cl);
    if (rc) {
        memset(c->cpu_row, 0xff, c->o.rows * sizeof(*c->cpu_row));
        return rc;
    }
    for (uint64_t i = 0; i < n; i++)
        c->cpu_row[rows[i]] = (int64_t)i;
    c->cpu_buf = buffer;
    return 0;
}

int qual_fcache_stats(struct qual_fcache *c, struct qual_fcache_stats *out, int reset)
{
    if (!c || !out)
        return qual_set_error(-EINVAL, "cache or output is NULL");
    *out = c->st;
    if (reset) {
        uint64_t pinned = c->st.pinned_pages;
        memset(&c->st, 0, sizeof(c->st));
        c->st.pinned_pages = pinned; /* a state, not a counter */
    }
    return 0;
}

int fcache_cmp_page(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int qual_fcache_probe(struct qual_fcache *c, const int64_t *rows, uint64_t n, uint64_t *misses)
{
    if (!c || !misses)
        return qual_set_error(-EINVAL, "cache or output is NULL");
    int rc = check_rows(c, rows, n);
    if (rc)
        return rc;
    uint64_t *pages = malloc((n ? n : 1) * c->row_pages * sizeof(*pages)), m = 0;
    if (!pages)
        return qual_set_error(-ENOMEM, "no memory to probe %llu rows", (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        if (c->cpu_row && c->cpu_row[rows[i]] >= 0)
            continue;
        for (uint32_t k = 0; k < c->row_pages; k++) {
            uint64_t p = (uint64_t)rows[i] * c->row_pages + k;
            if (c->slot_of[p] == NO_SLOT)
                pages[m++] = p;
        }
    }
    qsort(pages, m, sizeof(*pages), fcache_cmp_page);
    uint64_t distinct = 0;
    for (uint64_t j = 0; j < m; j++)
        distinct += j == 0 || pages[j] != pages[j - 1];
    free(pages);
    *misses = distinct;
    return 0;
}

int qual_fcache_drop(struct qual_fcache *c)
{
    if (!c)
        return qual_set_error(-EINVAL, "cache is NULL");
    for (uint64_t s = 0; s < c->o.capacity; s++) {
        if (c->refs[s])
            return qual_set_error(-EBUSY, "a gather holds slot %llu", (unsigned long long)s);
    }
    for (uint64_t s = 0; s < c->o.capacity; s++) {
        if (c->slot_page[s] >= 0)
            c->slot_of[c->slot_page[s]] = NO_SLOT;
        c->slot_page[s] = -1;
        c->recent[s] = 0;
    }
    return 0;
}
