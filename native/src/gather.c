/* gather.c — copy feature rows out of the cache into caller memory, reading what is missing,
 * as one stream: the row scan hands each window of missing pages (sorted, adjacent pages
 * coalesced; in row order when coalescing is off) to the queue while earlier reads are in
 * flight, and rows are copied out, in order, as their pages land, so the queue stays full
 * from the first read to the last. Every page is read once per gather; a gather bigger than
 * the cache waits for copies to free slots. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "fcache.h"

/* A gather whose output is bigger than this goes around the CPU caches: its rows are written
 * with streaming stores, which do not first read each destination line from memory (a third
 * of the copy's cost there) and do not flush what the cache holds. A smaller one stays in
 * the caches, where whoever consumes the batch reads it next. */
#define STREAM_OUTPUT (8u << 20)

/* Copy len bytes, with streaming stores where both ends allow them. */
static void copy_out(void *dst, const void *src, size_t len, int stream)
{
#ifdef __SSE2__
    if (stream && !(((uintptr_t)dst | (uintptr_t)src) & 15) && !(len & 63)) {
        __m128i *d = dst;
        const __m128i *s = src;
        for (size_t i = 0; i < len / 16; i += 4) {
            __m128i a = _mm_load_si128(s + i), b = _mm_load_si128(s + i + 1);
            __m128i c = _mm_load_si128(s + i + 2), e = _mm_load_si128(s + i + 3);
            _mm_stream_si128(d + i, a);
            _mm_stream_si128(d + i + 1, b);
            _mm_stream_si128(d + i + 2, c);
            _mm_stream_si128(d + i + 3, e);
        }
        return;
    }
#endif
    (void)stream;
    memcpy(dst, src, len);
}

/* Missing pages found by the scan before they are sorted and handed to the queue: enough to
 * find neighbours to coalesce, few enough to keep the queue fed between windows. */
#define WINDOW 1024u

struct gather {
    struct qual_fcache *c;
    const int64_t *rows;
    uint64_t n;
    unsigned char *dst;
    struct qual_ctl *ctl;
    uint32_t *slot;     /* per (row, page): the slot holding it; NO_SLOT for a CPU-buffer row */
    uint64_t scan;      /* the row the scan is at */
    uint32_t scan_k;    /* and the page of it (a row the cache could not take whole yet) */
    uint64_t copied;    /* rows before this one are copied out and let go of */
    uint64_t win[WINDOW]; /* this window's missing pages, sorted */
    uint64_t nwin, next;  /* how many; the first not yet handed to the queue */
    unsigned inflight;
    int stream;         /* the output is written around the caches (STREAM_OUTPUT) */
};

/* Copy rows out, in order, while the next one's pages have all landed, and let go of them. */
static void copy_ready(struct gather *g)
{
    struct qual_fcache *c = g->c;
    const uint32_t ps = c->o.page_size, rb = c->o.row_bytes, rp = c->row_pages;
    uint64_t from = g->copied;
    for (; g->copied < g->scan; g->copied++) {
        const uint32_t *s = g->slot + g->copied * rp;
        if (s[0] == NO_SLOT)
            continue; /* a CPU-buffer row, copied when scanned */
        uint32_t k = 0;
        while (k < rp && !c->loading[s[k]])
            k++;
        if (k < rp)
            break;
        unsigned char *out = g->dst + g->copied * rb;
        for (k = 0; k < rp; k++) {
            uint32_t at = k * ps;
            if (at < rb)
                copy_out(out + at, c->mem + (size_t)s[k] * ps, rb - at < ps ? rb - at : ps,
                         g->stream);
            c->refs[s[k]]--;
        }
    }
    if (g->copied > from) {
        __atomic_add_fetch(&g->ctl->bytes_done, (g->copied - from) * rb, __ATOMIC_RELAXED);
        __atomic_add_fetch(&g->ctl->ops_done, g->copied - from, __ATOMIC_RELAXED);
    }
}

/* Scan rows into the next window: a slot for every page (hits held where they are, misses
 * given a victim's slot and marked loading). Stops at a full window, at the end, or when every
 * slot is held (-EBUSY: copies must free some first). */
static int scan(struct gather *g)
{
    struct qual_fcache *c = g->c;
    const uint32_t rp = c->row_pages, rb = c->o.row_bytes;
    g->nwin = g->next = 0;
    for (; g->scan < g->n; g->scan++, g->scan_k = 0) {
        int64_t r = g->rows[g->scan];
        if (g->scan_k == 0 && c->cpu_row && c->cpu_row[r] >= 0) {
            memcpy(g->dst + g->scan * rb, c->cpu_buf + c->cpu_row[r] * rb, rb);
            g->slot[g->scan * rp] = NO_SLOT;
            c->st.cpu_hits++;
            continue;
        }
        for (; g->scan_k < rp; g->scan_k++) {
            if (g->nwin == WINDOW)
                return 0;
            uint64_t p = (uint64_t)r * rp + g->scan_k;
            uint32_t s = c->slot_of[p];
            if (s != NO_SLOT) {
                c->st.hits++; /* cached, or already being read in this gather */
            } else {
                if (fcache_victim(c, &s) == -EBUSY)
                    return -EBUSY;
                c->st.misses++;
                c->slot_of[p] = s;
                c->slot_page[s] = (int64_t)p;
                c->loading[s] = 1;
                g->win[g->nwin++] = p;
            }
            c->st.accesses++;
            c->refs[s]++;
            c->recent[s] = 1;
            g->slot[g->scan * rp + g->scan_k] = s;
        }
    }
    return 0;
}

/* The next window: scanned, sorted when pages may coalesce; IOQ_LATER when the cache is held
 * whole by reads in flight and rows not yet copied. */
static int refill(struct gather *g)
{
    int rc = scan(g);
    if (rc == -EBUSY && g->nwin == 0) {
        if (g->inflight)
            return IOQ_LATER;
        copy_ready(g); /* nothing in flight: every scanned row can go */
        rc = scan(g);
        if (rc == -EBUSY && g->nwin == 0)
            return qual_set_error(-EBUSY, "the cache's %llu pages cannot hold one row of %u "
                                  "pages", (unsigned long long)g->c->o.capacity,
                                  g->c->row_pages);
    }
    if (g->c->o.max_coalesce > 1) /* else row order: the order in which rows copy out */
        qsort(g->win, g->nwin, sizeof(*g->win), fcache_cmp_page);
    return 0;
}

/* The queue asks for the next run of adjacent missing pages, up to max_coalesce of them. */
static int run_next(void *ctx, struct ioq_io *io)
{
    struct gather *g = ctx;
    struct qual_fcache *c = g->c;
    const uint32_t ps = c->o.page_size;
    if (g->next >= g->nwin) {
        int rc = refill(g);
        if (rc)
            return rc;
        if (g->nwin == 0)
            return 0; /* every row scanned, every miss handed over */
    }
    uint64_t first = g->win[g->next], len = 1;
    while (g->next + len < g->nwin && len < c->o.max_coalesce &&
           g->win[g->next + len] == first + len)
        len++;
    io->op = QUAL_OP_READ;
    io->off = first * ps;
    io->len = (uint32_t)(len * ps);
    io->tag = first;
    if (len == 1) {
        io->buf = c->mem + (size_t)c->slot_of[first] * ps;
    } else {
        struct iovec *v = c->iov + (size_t)io->slot * c->o.max_coalesce;
        for (uint64_t j = 0; j < len; j++) {
            v[j].iov_base = c->mem + (size_t)c->slot_of[first + j] * ps;
            v[j].iov_len = ps;
        }
        io->iov = v;
        io->nvec = (unsigned)len;
    }
    g->next += len;
    g->inflight++;
    c->st.reads++;
    return 1;
}

static int run_done(void *ctx, const struct ioq_io *io, int64_t res, uint64_t lat_ns)
{
    (void)lat_ns;
    struct gather *g = ctx;
    struct qual_fcache *c = g->c;
    g->inflight--;
    if (res != (int64_t)io->len)
        return qual_set_error(res < 0 ? (int)res : -EIO, "reading %u pages at offset %llu of "
                              "%s: %s", io->len / c->o.page_size, (unsigned long long)io->off,
                              c->path, res < 0 ? strerror((int)-res) : "short read");
    for (uint64_t p = io->tag; p < io->tag + io->len / c->o.page_size; p++)
        c->loading[c->slot_of[p]] = 0;
    c->st.read_bytes += io->len;
    return 0; /* its rows are copied out between submissions (between) */
}

/* While the next reads are with the device: copy out the rows whose pages have landed. */
static void run_between(void *ctx)
{
    copy_ready(ctx);
}

/* After a failure: pages not read hold no valid data, and nothing stays held. */
static void abandon(struct gather *g)
{
    struct qual_fcache *c = g->c;
    for (uint64_t s = 0; s < c->o.capacity; s++) {
        if (c->loading[s]) {
            c->slot_of[c->slot_page[s]] = NO_SLOT;
            c->slot_page[s] = -1;
            c->loading[s] = 0;
        }
    }
    for (uint64_t i = g->copied; i <= g->scan && i < g->n; i++) {
        uint32_t held = i < g->scan ? c->row_pages : g->scan_k;
        for (uint32_t k = 0; k < held && g->slot[i * c->row_pages] != NO_SLOT; k++)
            c->refs[g->slot[i * c->row_pages + k]]--;
    }
}

int qual_fcache_gather(struct qual_fcache *c, const int64_t *rows, uint64_t n, void *dst,
                       struct qual_ctl *ctl)
{
    if (!c || !ctl || (!dst && n) || (!rows && n))
        return qual_set_error(-EINVAL, "cache, rows, destination or ctl is NULL");
    for (uint64_t i = 0; i < n; i++)
        if (rows[i] < 0 || (uint64_t)rows[i] >= c->o.rows)
            return qual_set_error(-EINVAL, "row %lld is outside the store's %llu rows",
                                  (long long)rows[i], (unsigned long long)c->o.rows);
    int rc = fcache_queue(c);
    if (rc)
        return rc;
    uint64_t need = (n ? n : 1) * c->row_pages;
    if (need > c->gather_slots_len) { /* kept between gathers: no page faults per gather */
        uint32_t *more = realloc(c->gather_slots, need * sizeof(*more));
        if (!more)
            return qual_set_error(-ENOMEM, "no memory to gather %llu rows",
                                  (unsigned long long)n);
        c->gather_slots = more;
        c->gather_slots_len = need;
    }
    struct gather gs = {.c = c, .rows = rows, .n = n, .dst = dst, .ctl = ctl,
                        .slot = c->gather_slots, .stream = n * c->o.row_bytes >= STREAM_OUTPUT},
                  *g = &gs;
    uint64_t t0 = now_ns();
    ioq_set_cancel(c->q, &ctl->cancel);
    struct ioq_client cl = {g, run_next, run_done, run_between};
    rc = ioq_run(c->q, &cl);
    c->st.io_ns += now_ns() - t0;
    if (rc)
        abandon(g);
    else
        copy_ready(g);
#ifdef __SSE2__
    _mm_sfence(); /* streamed rows are in memory before the caller looks */
#endif
    return rc;
}
