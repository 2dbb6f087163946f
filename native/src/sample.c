/* sample.c — uniform neighbour sampling over a relation's CSC, deterministic per node. */
#include <errno.h>

#include "engine.h"

int qual_sample(const int64_t *indptr, const int64_t *indices, uint64_t num_dst,
                const int64_t *dst, uint64_t n_dst, uint32_t fanout, uint64_t seed,
                int64_t *out_src, int64_t *out_dst_pos, uint64_t *out_edges)
{
    if (!indptr || (!indices && num_dst && indptr[num_dst]) || (!dst && n_dst) || !out_edges ||
        (n_dst && fanout && (!out_src || !out_dst_pos)))
        return qual_set_error(-EINVAL, "sampling needs its arrays");
    uint64_t e = 0;
    for (uint64_t i = 0; i < n_dst; i++) {
        int64_t v = dst[i];
        if (v < 0 || (uint64_t)v >= num_dst)
            return qual_set_error(-EINVAL, "node %lld is outside the relation's %llu nodes",
                                  (long long)v, (unsigned long long)num_dst);
        int64_t lo = indptr[v], deg = indptr[v + 1] - lo;
        if (deg <= (int64_t)fanout) {
            for (int64_t k = 0; k < deg; k++) {
                out_src[e] = indices[lo + k];
                out_dst_pos[e++] = (int64_t)i;
            }
            continue;
        }
        /* Floyd's algorithm: fanout distinct positions out of deg, uniformly */
        struct rng r;
        rng_seed(&r, seed ^ mix64((uint64_t)v));
        uint64_t first = e;
        for (int64_t j = deg - fanout; j < deg; j++) {
            int64_t t = (int64_t)rng_below(&r, (uint64_t)j + 1);
            for (uint64_t k = first; k < e; k++) {
                if (out_src[k] == lo + t) {
                    t = j;
                    break;
                }
            }
            out_src[e] = lo + t; /* a position for now; turned into the neighbour below */
            out_dst_pos[e++] = (int64_t)i;
        }
        for (uint64_t k = first; k < e; k++)
            out_src[k] = indices[out_src[k]];
    }
    *out_edges = e;
    return 0;
}
