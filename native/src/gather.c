/* gather.c — copy feature rows out of the cache into caller memory, reading what is missing:
 * every page once per gather, sorted, adjacent pages coalesced into one vectored read,
 * queue_depth reads in flight. A gather bigger than the cache runs in rounds. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "fcache.h"

struct gather {
    struct qual_fcache *c;
    const int64_t *rows;
    unsigned char *dst;
    struct qual_ctl *ctl;
    uint32_t *slot;     /* per (row, page): the slot holding it; NO_SLOT for a CPU-buffer row */
    uint64_t *miss;     /* pages to read in this round */
    uint64_t nmiss;
    struct iovec *iov;  /* one per missing page, in page order */
    uint64_t next;      /* the first missing page not yet handed to the queue */
};

/* The queue asks for the next run of adjacent missing pages, up to max_coalesce of them. */
static int run_next(void *ctx, struct ioq_io *io)
{
    struct gather *g = ctx;
    struct qual_fcache *c = g->c;
    if (g->next >= g->nmiss)
        return 0;
    uint64_t len = 1;
    while (g->next + len < g->nmiss && len < c->o.max_coalesce &&
           g->miss[g->next + len] == g->miss[g->next] + len)
        len++;
    io->op = QUAL_OP_READ;
    io->off = g->miss[g->next] * c->o.page_size;
    io->iov = g->iov + g->next;
    io->nvec = (unsigned)len;
    io->len = (uint32_t)(len * c->o.page_size);
    g->next += len;
    c->st.reads++;
    return 1;
}

static int run_done(void *ctx, const struct ioq_io *io, int64_t res, uint64_t lat_ns)
{
    (void)lat_ns;
    struct gather *g = ctx;
    if (res == (int64_t)io->len)
        return 0;
    return qual_set_error(res < 0 ? (int)res : -EIO, "reading %u pages at offset %llu of %s: %s",
                          io->nvec, (unsigned long long)io->off, g->c->path,
                          res < 0 ? strerror((int)-res) : "short read");
}

/* Read this round's missing pages into their slots. */
static int read_misses(struct gather *g)
{
    struct qual_fcache *c = g->c;
    const uint32_t ps = c->o.page_size;
    if (g->nmiss == 0)
        return 0;
    qsort(g->miss, g->nmiss, sizeof(*g->miss), fcache_cmp_page);
    for (uint64_t j = 0; j < g->nmiss; j++) {
        g->iov[j].iov_base = c->mem + (size_t)c->slot_of[g->miss[j]] * ps;
        g->iov[j].iov_len = ps;
    }
    uint64_t t0 = now_ns();
    g->next = 0;
    ioq_set_cancel(c->q, &g->ctl->cancel);
    struct ioq_client cl = {g, run_next, run_done};
    int rc = ioq_run(c->q, &cl);
    c->st.io_ns += now_ns() - t0;
    if (!rc)
        c->st.read_bytes += g->nmiss * ps;
    return rc;
}

/* Copy rows [from, to) out of their slots and let go of them. */
static void copy_rows(struct gather *g, uint64_t from, uint64_t to)
{
    struct qual_fcache *c = g->c;
    const uint32_t ps = c->o.page_size, rb = c->o.row_bytes;
    for (uint64_t i = from; i < to; i++) {
        unsigned char *out = g->dst + i * rb;
        for (uint32_t k = 0; k < c->row_pages; k++) {
            uint32_t s = g->slot[i * c->row_pages + k];
            if (s == NO_SLOT)
                break; /* a CPU-buffer row, copied already */
            uint32_t at = k * ps;
            if (at < rb)
                memcpy(out + at, c->mem + (size_t)s * ps, rb - at < ps ? rb - at : ps);
            c->refs[s]--;
        }
    }
    __atomic_add_fetch(&g->ctl->bytes_done, (to - from) * rb, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g->ctl->ops_done, to - from, __ATOMIC_RELAXED);
}

/* After a failed read: the round's pages hold no valid data, and nothing stays referenced. */
static void abandon(struct gather *g, uint64_t from, uint64_t upto, uint32_t pages_of_last)
{
    struct qual_fcache *c = g->c;
    for (uint64_t j = 0; j < g->nmiss; j++) {
        uint32_t s = c->slot_of[g->miss[j]];
        c->slot_page[s] = -1;
        c->slot_of[g->miss[j]] = NO_SLOT;
    }
    for (uint64_t i = from; i <= upto; i++) {
        uint32_t n = i < upto ? c->row_pages : pages_of_last;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t s = g->slot[i * c->row_pages + k];
            if (s == NO_SLOT)
                break;
            c->refs[s]--;
        }
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
    const uint32_t rp = c->row_pages;
    struct gather g = {c, rows, dst, ctl, NULL, NULL, 0, NULL, 0};
    g.slot = malloc((n ? n : 1) * rp * sizeof(*g.slot));
    g.miss = malloc((n ? n : 1) * rp * sizeof(*g.miss));
    g.iov = malloc((n ? n : 1) * rp * sizeof(*g.iov));
    if (!g.slot || !g.miss || !g.iov) {
        free(g.slot);
        free(g.miss);
        free(g.iov);
        return qual_set_error(-ENOMEM, "no memory to gather %llu rows", (unsigned long long)n);
    }
    int rc = 0;
    uint64_t round_start = 0, i = 0;
    uint32_t k = 0;
    for (; i < n && !rc; i++) {
        int64_t r = rows[i];
        if (c->cpu_row && c->cpu_row[r] >= 0) {
            memcpy(g.dst + i * c->o.row_bytes, c->cpu_buf + c->cpu_row[r] * c->o.row_bytes,
                   c->o.row_bytes);
            g.slot[i * rp] = NO_SLOT;
            c->st.cpu_hits++;
            continue;
        }
        for (k = 0; k < rp; k++) {
            uint64_t p = (uint64_t)r * rp + k;
            uint32_t s = c->slot_of[p];
            c->st.accesses++;
            if (s != NO_SLOT) {
                c->st.hits++; /* cached, or already being read in this round */
            } else {
                if (fcache_victim(c, &s) == -EBUSY) {
                    /* the cache is full of this round's pages: finish the round, go on */
                    if ((rc = read_misses(&g)) != 0)
                        break;
                    copy_rows(&g, round_start, i);
                    g.nmiss = 0;
                    round_start = i;
                    if (fcache_victim(c, &s) == -EBUSY) {
                        rc = qual_set_error(-EBUSY, "the cache's %llu pages cannot hold one "
                                            "row of %u pages", (unsigned long long)c->o.capacity,
                                            rp);
                        break;
                    }
                }
                c->st.misses++;
                c->slot_of[p] = s;
                c->slot_page[s] = (int64_t)p;
                g.miss[g.nmiss++] = p;
            }
            c->refs[s]++;
            c->recent[s] = 1;
            g.slot[i * rp + k] = s;
        }
    }
    if (rc) {
        abandon(&g, round_start, i, k); /* the loop broke inside row i, at page k */
    } else if ((rc = read_misses(&g)) != 0) {
        abandon(&g, round_start, n, 0);
    } else {
        copy_rows(&g, round_start, n);
    }
    free(g.slot);
    free(g.miss);
    free(g.iov);
    return rc;
}
