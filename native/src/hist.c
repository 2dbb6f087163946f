/* hist.c — log-linear latency histogram with <= 1/128 relative error (see qual.h). */
#include <errno.h>
#include <string.h>

#include "engine.h"

#define SUB (1u << QUAL_HIST_SUB_BITS)      /* 64 buckets per power of two */
#define EXACT (2u * SUB)                    /* values below 128 ns are their own bucket */
#define MAX_SHIFT 34u                       /* last group starts at 64 << 34 = 2^40 ns */

_Static_assert(QUAL_HIST_BUCKETS == (MAX_SHIFT + 2) * SUB, "bucket count");
_Static_assert(sizeof(((struct qual_hist *)0)->buckets) / sizeof(uint64_t) == QUAL_HIST_BUCKETS,
               "bucket array");

static uint32_t bucket_of(uint64_t v)
{
    if (v < EXACT)
        return (uint32_t)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = msb - QUAL_HIST_SUB_BITS;
    if (shift > MAX_SHIFT)
        return QUAL_HIST_BUCKETS - 1;
    return shift * SUB + (uint32_t)(v >> shift);
}

static uint64_t value_of(uint32_t i)
{
    if (i < EXACT)
        return i;
    unsigned shift = i / SUB - 1;
    uint64_t lower = (uint64_t)(SUB + i % SUB) << shift;
    return lower + ((1ull << shift) - 1) / 2;
}

int qual_hist_init(struct qual_hist *h)
{
    if (!h)
        return qual_set_error(-EINVAL, "histogram is NULL");
    memset(h, 0, sizeof(*h));
    h->min_ns = UINT64_MAX;
    return 0;
}

int qual_hist_record(struct qual_hist *h, uint64_t ns)
{
    h->buckets[bucket_of(ns)]++;
    h->count++;
    h->sum_ns += ns;
    if (ns < h->min_ns)
        h->min_ns = ns;
    if (ns > h->max_ns)
        h->max_ns = ns;
    return 0;
}

int qual_hist_merge(struct qual_hist *dst, const struct qual_hist *src)
{
    if (!dst || !src)
        return qual_set_error(-EINVAL, "histogram is NULL");
    for (uint32_t i = 0; i < QUAL_HIST_BUCKETS; i++)
        dst->buckets[i] += src->buckets[i];
    dst->count += src->count;
    dst->sum_ns += src->sum_ns;
    if (src->min_ns < dst->min_ns)
        dst->min_ns = src->min_ns;
    if (src->max_ns > dst->max_ns)
        dst->max_ns = src->max_ns;
    return 0;
}

int qual_hist_percentile(const struct qual_hist *h, double pct, uint64_t *ns)
{
    if (!h || !ns)
        return qual_set_error(-EINVAL, "histogram or output is NULL");
    if (!(pct > 0.0 && pct <= 100.0))
        return qual_set_error(-EINVAL, "percentile %g is outside (0, 100]", pct);
    if (h->count == 0)
        return qual_set_error(-ENODATA, "histogram is empty");
    /* nearest rank: the smallest value with at least ceil(pct/100 * N) samples at or below */
    double exact = pct / 100.0 * (double)h->count;
    uint64_t rank = (uint64_t)exact;
    if ((double)rank < exact)
        rank++;
    if (rank == 0)
        rank = 1;
    uint64_t seen = 0;
    for (uint32_t i = 0; i < QUAL_HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank) {
            uint64_t v = value_of(i);
            if (v < h->min_ns)
                v = h->min_ns;
            if (v > h->max_ns)
                v = h->max_ns;
            *ns = v;
            return 0;
        }
    }
    *ns = h->max_ns;
    return 0;
}

int qual_hist_bucket_value(uint32_t i, uint64_t *ns)
{
    if (i >= QUAL_HIST_BUCKETS || !ns)
        return qual_set_error(-EINVAL, "bucket %u is out of range", i);
    *ns = value_of(i);
    return 0;
}

int qual_hist_bucket_of(uint64_t ns, uint32_t *i)
{
    if (!i)
        return qual_set_error(-EINVAL, "output is NULL");
    *i = bucket_of(ns);
    return 0;
}
