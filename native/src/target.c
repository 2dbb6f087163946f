/* target.c — opening a target's path as the caller checked it, and what the kernel says about
 * its direct-I/O alignment and which of a file's pages it caches. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

int target_open(const char *path, int flags, const struct qual_inode *expect, const char *op,
                int *fd_out)
{
    int checked = expect && (expect->dev || expect->ino);
    int fd = open(path, flags | O_CLOEXEC | (checked ? O_NOFOLLOW : 0));
    if (fd < 0) {
        int err = errno;
        if (err == EINVAL && (flags & O_DIRECT))
            return qual_set_error(-EINVAL, "%s does not support O_DIRECT", path);
        if (err == ELOOP && checked)
            return qual_set_error(-EPERM, "%s is now a symbolic link, not what was checked: "
                                  "refusing to %s through it", path, op);
        return qual_set_error(-err, "open %s for %s: %s", path, op, strerror(err));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return qual_set_error(-err, "stat %s: %s", path, strerror(err));
    }
    if (checked && ((uint64_t)st.st_dev != expect->dev || (uint64_t)st.st_ino != expect->ino)) {
        close(fd);
        return qual_set_error(-EPERM, "%s is no longer the file or device that was checked "
                              "(replaced since): refusing to %s it", path, op);
    }
    *fd_out = fd;
    return 0;
}

int qual_page_residency(const char *path, uint64_t pages, uint8_t *vec)
{
    if (!path || (!vec && pages))
        return qual_set_error(-EINVAL, "path or vector is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return qual_set_error(-errno, "open %s: %s", path, strerror(errno));
    struct stat st;
    long psz = sysconf(_SC_PAGESIZE);
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = qual_set_error(-errno, "stat %s: %s", path, strerror(errno));
    } else if ((uint64_t)(st.st_size + psz - 1) / (uint64_t)psz != pages) {
        rc = qual_set_error(-EINVAL, "%s holds %llu pages, not %llu", path,
                            (unsigned long long)((st.st_size + psz - 1) / psz),
                            (unsigned long long)pages);
    } else if (pages) {
        /* a fresh mapping faults nothing in: mincore reports the file's page cache */
        void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            rc = qual_set_error(-errno, "map %s: %s", path, strerror(errno));
        } else {
            if (mincore(map, (size_t)st.st_size, vec) != 0)
                rc = qual_set_error(-errno, "mincore %s: %s", path, strerror(errno));
            munmap(map, (size_t)st.st_size);
        }
    }
    close(fd);
    return rc;
}
