/* fcache.h — the feature cache's state, shared by cache.c (pages, slots, pins) and gather.c. */
#ifndef QUAL_FCACHE_H
#define QUAL_FCACHE_H

#include <sys/types.h>
#include <sys/uio.h>

#include "engine.h"

#define NO_SLOT UINT32_MAX

struct qual_fcache {
    struct qual_fcache_opts o;
    char *path;
    int fd;
    int backend;
    struct ioq *q;            /* reads into the slots (the cache's own memory) */
    pid_t q_owner;            /* the thread q's ring belongs to (it submits faster so) */
    struct iovec *iov;        /* max_coalesce per queue slot: a coalesced read's slots */
    uint64_t pages;           /* pages in the store */
    uint32_t row_pages;       /* pages a row spans */
    /* per store page */
    uint32_t *slot_of;        /* the slot holding it, or NO_SLOT */
    uint16_t *window;         /* pins by batches sampled ahead */
    /* per row: index in the CPU buffer, or -1 (NULL until a CPU buffer is set) */
    int64_t *cpu_row;
    unsigned char *cpu_buf;
    /* per slot */
    unsigned char *mem;       /* capacity * page_size bytes */
    int64_t *slot_page;       /* the page in the slot, or -1 */
    uint32_t *refs;           /* held by the gather in progress */
    uint8_t *recent;          /* the clock's second-chance bit */
    uint8_t *loading;         /* 1 while the page's read is in flight (not yet valid) */
    uint64_t hand;
    uint32_t *gather_slots;   /* a gather's (row, page) -> slot, kept for the next one */
    uint64_t gather_slots_len;
    struct qual_fcache_stats st;
};

/* A slot for a page about to be read: a free one, else the clock's victim: never a page held by
 * the gather in progress, and a window-pinned page only when nothing else is left; -EBUSY when
 * the gather holds every slot. */
int fcache_victim(struct qual_fcache *c, uint32_t *slot);

/* The queue, for the calling thread: a ring that only one thread submits to skips the
 * kernel's cross-thread completion work, so it is (re)made for the thread that gathers. */
int fcache_queue(struct qual_fcache *c);

/* qsort order of page numbers (uint64_t). */
int fcache_cmp_page(const void *a, const void *b);

#endif
