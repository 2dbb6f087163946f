/* fault.c — the fault-injection plan, applied when an I/O completes
 * (docs/ARCHITECTURE.md §3). */
#include <errno.h>

#include "engine.h"

void fault_delay(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int64_t fault_apply(struct qual_fault *faults, uint32_t nfaults, int op, uint64_t off,
                    uint32_t len, int64_t res, uint64_t *delay_ns)
{
    for (uint32_t i = 0; i < nfaults; i++) {
        struct qual_fault *f = &faults[i];
        if (f->op != -1 && f->op != op)
            continue;
        if (off + len <= f->offset_lo || off >= f->offset_hi)
            continue;
        uint64_t n = __atomic_add_fetch(&f->seen, 1, __ATOMIC_RELAXED);
        uint32_t every = f->every ? f->every : 1;
        if (n % every)
            continue;
        uint64_t hit = __atomic_add_fetch(&f->hits, 1, __ATOMIC_RELAXED);
        if (f->limit && hit > f->limit) {
            __atomic_sub_fetch(&f->hits, 1, __ATOMIC_RELAXED);
            continue;
        }
        *delay_ns += f->delay_ns;
        if (f->error)
            res = -(int64_t)f->error;
        else if (f->short_bytes && res > (int64_t)f->short_bytes)
            res = f->short_bytes;
    }
    return res;
}
