/* memory.c — memory that I/O lands in: fresh anonymous pages, aligned, faulted in before any
 * I/O. A region of 2 MiB or more is 2 MiB-aligned and asks for transparent huge pages, so a
 * queue's or a cache's tens of MiB fault in, and pin for registered buffers, as a few dozen
 * pages instead of thousands (the kernel hands either over zeroed: one touch a page). */
#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>

#include "engine.h"

#define SMALL_PAGE 4096u
#define HUGE_PAGE (2u << 20)

static size_t rounded(size_t len)
{
    return (len + SMALL_PAGE - 1) & ~(size_t)(SMALL_PAGE - 1);
}

void *io_memory_alloc(size_t len, size_t align)
{
    size_t want = len >= HUGE_PAGE ? HUGE_PAGE : SMALL_PAGE;
    if (align > want)
        want = align; /* a power of two, as alignments are */
    size_t size = rounded(len ? len : 1), map = size + want - SMALL_PAGE;
    unsigned char *m = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                            -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    size_t lead = (want - (uintptr_t)m % want) % want;
    if (lead)
        munmap(m, lead);
    if (map - lead > size)
        munmap(m + lead + size, map - lead - size);
    unsigned char *mem = m + lead;
#ifdef MADV_HUGEPAGE
    if (size >= HUGE_PAGE)
        madvise(mem, size, MADV_HUGEPAGE); /* advice: without it, small pages work */
#endif
    for (size_t off = 0; off < size; off += SMALL_PAGE)
        ((volatile unsigned char *)mem)[off] = 0;
    return mem;
}

void io_memory_free(void *mem, size_t len)
{
    if (mem)
        munmap(mem, rounded(len ? len : 1));
}
