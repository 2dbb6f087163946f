/* target.c — what the kernel says about a target's direct-I/O alignment. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

#include "engine.h"

int qual_dio_align(const char *path, uint32_t *mem_align, uint32_t *offset_align)
{
    if (!path || !mem_align || !offset_align)
        return qual_set_error(-EINVAL, "path or output is NULL");
#ifdef STATX_DIOALIGN
    struct statx stx;
    memset(&stx, 0, sizeof(stx));
    if (statx(AT_FDCWD, path, 0, STATX_DIOALIGN, &stx) != 0)
        return qual_set_error(-errno, "statx %s: %s", path, strerror(errno));
    if (!(stx.stx_mask & STATX_DIOALIGN) || stx.stx_dio_offset_align == 0)
        return qual_set_error(-EOPNOTSUPP, "%s: no direct-I/O alignment reported", path);
    *mem_align = stx.stx_dio_mem_align;
    *offset_align = stx.stx_dio_offset_align;
    return 0;
#else
    return qual_set_error(-EOPNOTSUPP, "%s: kernel headers lack STATX_DIOALIGN", path);
#endif
}
