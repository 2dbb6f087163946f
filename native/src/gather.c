/* gather.c — copy feature rows out of the cache into caller memory, reading what is missing:
 * every page once per gather, sorted, adjacent pages coalesced into one vectored read,
 * queue_depth reads in flight. A gather bigger than the cache runs in rounds. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

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
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Read this round's missing pages into their slots. */
static int read_misses(struct gather *g)
{
    struct qual_fcache *c = g->c;
    const uint32_t ps = c->o.page_size;
    if (g->nmiss == 0)
        return 0;
    qsort(g->miss, g->nmiss, sizeof(*g->miss), cmp_u64);
    for (uint64_t j = 0; j < g->nmiss; j++) {
        g->iov[j].iov_base = c->mem + (size_t)c->slot_of[g->miss[j]] * ps;
        g->iov[j].iov_len = ps;
    }
    uint64_t t0 = now_ns();
    int rc = 0;
    uint64_t next = 0;      /* first page not yet requested */
    unsigned inflight = 0;
    int wait_only = 0;
    for (;;) {
        /* queue runs of adjacent pages, up to max_coalesce each */
        while (!rc && next < g->nmiss && inflight < c->o.queue_depth) {
            uint64_t len = 1;
            while (next + len < g->nmiss && len < c->o.max_coalesce &&
                   g->miss[next + len] == g->miss[next] + len)
                len++;
            uint64_t off = g->miss[next] * ps;
            c->st.reads++;
            if (c->ring) {
                /* user_data: the run's first page index and length */
                ring_queue_vec(c->ring, QUAL_OP_READ, next << 16 | len, g->iov + next,
                               (unsigned)len, off);
                inflight++;
            } else {
                ssize_t n;
                do {
                    n = preadv(c->fd, g->iov + next, (int)len, (off_t)off);
                } while (n < 0 && errno == EINTR);
                if (n != (ssize_t)(len * ps))
                    rc = qual_set_error(n < 0 ? -errno : -EIO, "reading %llu pages at offset %llu "
                                        "of %s: %s", (unsigned long long)len,
                                        (unsigned long long)off, c->path,
                                        n < 0 ? strerror(errno) : "short read");
            }
            next += len;
            if (__atomic_load_n(&g->ctl->cancel, __ATOMIC_RELAXED) && !rc)
                rc = qual_set_error(-ECANCELED, "cancelled");
        }
        if (!c->ring || inflight == 0 || (wait_only && inflight == ring_pending(c->ring)))
            break;
        int src = wait_only ? ring_wait(c->ring) : ring_submit(c->ring, 1);
        if (src) {
            rc = rc ? rc : src;
            wait_only = 1;
        }
        uint64_t ud;
        int32_t res;
        while (ring_reap(c->ring, &ud, &res)) {
            inflight--;
            uint64_t first = ud >> 16, len = ud & 0xffff;
            if (res != (int32_t)(len * ps) && !rc) {
                uint64_t off = g->miss[first] * ps;
                rc = qual_set_error(res < 0 ? res : -EIO, "reading %llu pages at offset %llu of "
                                    "%s: %s", (unsigned long long)len, (unsigned long long)off,
                                    c->path, res < 0 ? strerror(-res) : "short read");
            }
        }
    }
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
    struct gather g = {c, rows, dst, ctl, NULL, NULL, 0, NULL};
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
