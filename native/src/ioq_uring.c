/* ioq_uring.c — the io_uring backend of the queue, by raw syscalls (no liburing): a ring on one
 * descriptor with the queue's buffers registered. It stages, submits, waits (bounded, so the
 * queue's loop always gets control back) and reaps; the loop itself is ioq.c's.
 *
 * Each feature that cuts the kernel's cost per I/O is used where the kernel offers it, and the
 * plain path kept where it does not: a single-issuer ring with deferred task work (else
 * cooperative task work), the target registered (fixed file), the buffers registered (fixed
 * buffers), the ring's own descriptor registered (entered by index), and a tick: a multishot
 * timeout in the ring that completes every IOQ_POLL_NS, which ends any wait (as every timeout's
 * completion does) without a timer of its own per wait (else each wait carries its timeout). QUAL_URING_WITHOUT,
 * a comma list of defer_taskrun, coop_taskrun, fixed_files, fixed_buffers, registered_ring and
 * tick, leaves those out: benchmarks/bench_uring_features.py measures each against the one
 * before. */
#include <errno.h>
#include <linux/io_uring.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "engine.h"

#ifndef IORING_SETUP_COOP_TASKRUN
#define IORING_SETUP_COOP_TASKRUN (1U << 8)
#endif
#ifndef IORING_SETUP_SINGLE_ISSUER
#define IORING_SETUP_SINGLE_ISSUER (1U << 12)
#endif
#ifndef IORING_SETUP_DEFER_TASKRUN
#define IORING_SETUP_DEFER_TASKRUN (1U << 13)
#endif
#ifndef IORING_TIMEOUT_MULTISHOT
#define IORING_TIMEOUT_MULTISHOT (1U << 6)
#endif
#ifndef IORING_ENTER_REGISTERED_RING
#define IORING_ENTER_REGISTERED_RING (1U << 4)
#define IORING_REGISTER_RING_FDS 20
#define IORING_UNREGISTER_RING_FDS 21
#endif

struct ring {
    int fd;
    int ring_index;           /* the ring's registered descriptor (entered by index), or -1 */
    int target_fd;
    int force_async;          /* IOSQE_ASYNC on every I/O: the file cannot issue non-blocking */
    int fixed_file;
    int fixed_bufs;
    int tick;                 /* the tick is armed: a wait needs no timeout of its own */
    struct __kernel_timespec tick_period;
    unsigned char *bufs;      /* the queue's buffers, or the client's memory (registered when */
    size_t bufs_len;          /* possible) */
    size_t buf_len;           /* a registered unit: one slot's buffer, or up to 1 GiB */
    /* submission ring */
    unsigned *sq_head;
    unsigned *sq_tail;
    unsigned *sq_mask;
    unsigned sq_local_tail;
    struct io_uring_sqe *sqes;
    /* completion ring */
    unsigned *cq_head;
    unsigned *cq_tail;
    unsigned *cq_mask;
    struct io_uring_cqe *cqes;
    /* mappings */
    void *sq_map;
    size_t sq_map_len;
    void *cq_map;
    size_t cq_map_len;
    size_t sqes_len;
};

static int sys_setup(unsigned entries, struct io_uring_params *p)
{
    return (int)syscall(__NR_io_uring_setup, entries, p);
}

static int sys_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags,
                     const void *arg, size_t argsz)
{
    return (int)syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, arg, argsz);
}

static int sys_register(int fd, unsigned opcode, const void *arg, unsigned nr)
{
    return (int)syscall(__NR_io_uring_register, fd, opcode, arg, nr);
}

/* Whether QUAL_URING_WITHOUT names the feature. */
static int without(const char *feature)
{
    const char *list = getenv("QUAL_URING_WITHOUT");
    size_t n = strlen(feature);
    for (const char *at = list; at && (at = strstr(at, feature)) != NULL; at += n) {
        if ((at == list || at[-1] == ',') && (at[n] == '\0' || at[n] == ','))
            return 1;
    }
    return 0;
}

/* io_uring must bound its waits (IORING_FEAT_EXT_ARG, Linux 5.11): without it, psync is used. */
static int uring_probe(void)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    int fd = sys_setup(1, &p);
    if (fd < 0)
        return qual_set_error(-errno, "io_uring_setup: %s", strerror(errno));
    close(fd);
    if (!(p.features & IORING_FEAT_EXT_ARG))
        return qual_set_error(-ENOSYS, "io_uring here cannot wait with a timeout "
                              "(IORING_FEAT_EXT_ARG, Linux 5.11)");
    return 0;
}

/* Newer setup flags cut the cost of completions; older kernels refuse them with EINVAL. A
 * single-issuer ring may only be used by the thread that made it. */
static int create_ring(unsigned entries, struct io_uring_params *p, int single_issuer)
{
    static const unsigned tries[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
        IORING_SETUP_COOP_TASKRUN,
        0,
    };
    static const char *names[] = {"defer_taskrun", "coop_taskrun", NULL};
    int fd = -1;
    for (size_t i = single_issuer ? 0 : 1; i < sizeof(tries) / sizeof(tries[0]); i++) {
        if (names[i] && without(names[i]))
            continue;
        memset(p, 0, sizeof(*p));
        p->flags = tries[i];
        fd = sys_setup(entries, p);
        if (fd >= 0 || errno != EINVAL)
            break;
    }
    return fd;
}

static int map_rings(struct ring *r, const struct io_uring_params *p)
{
    r->sq_map_len = p->sq_off.array + p->sq_entries * sizeof(unsigned);
    r->cq_map_len = p->cq_off.cqes + p->cq_entries * sizeof(struct io_uring_cqe);
    int single = (p->features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single && r->cq_map_len > r->sq_map_len)
        r->sq_map_len = r->cq_map_len;
    r->sq_map = mmap(NULL, r->sq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                     r->fd, IORING_OFF_SQ_RING);
    if (r->sq_map == MAP_FAILED) {
        r->sq_map = NULL;
        return qual_set_error(-errno, "mmap io_uring SQ ring: %s", strerror(errno));
    }
    if (single) {
        r->cq_map = r->sq_map;
    } else {
        r->cq_map = mmap(NULL, r->cq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                         r->fd, IORING_OFF_CQ_RING);
        if (r->cq_map == MAP_FAILED) {
            r->cq_map = NULL;
            return qual_set_error(-errno, "mmap io_uring CQ ring: %s", strerror(errno));
        }
    }
    r->sqes_len = p->sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                   IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED) {
        r->sqes = NULL;
        return qual_set_error(-errno, "mmap io_uring SQEs: %s", strerror(errno));
    }
    unsigned char *sq = r->sq_map;
    unsigned char *cq = r->cq_map;
    r->sq_head = (unsigned *)(sq + p->sq_off.head);
    r->sq_tail = (unsigned *)(sq + p->sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p->sq_off.ring_mask);
    unsigned *array = (unsigned *)(sq + p->sq_off.array);
    for (unsigned i = 0; i < p->sq_entries; i++)
        array[i] = i; /* SQE i always sits in array slot i */
    r->sq_local_tail = *r->sq_tail;
    r->cq_head = (unsigned *)(cq + p->cq_off.head);
    r->cq_tail = (unsigned *)(cq + p->cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p->cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p->cq_off.cqes);
    return 0;
}

#define TICK_DATA UINT64_MAX /* the tick's completions, told from the I/Os' (slot numbers) */

/* Arms the tick: a timeout that completes every IOQ_POLL_NS for as long as the ring lives
 * (IORING_TIMEOUT_MULTISHOT, Linux 6.4). A kernel that refuses it completes it at once with an
 * error, and the waits keep their own timeouts. Only on a ring whose opening thread is the one
 * that waits (single issuer): the tick's completion is run by the thread that armed it, and
 * another thread, stuck in a call on a target that stopped answering, would never run it. */
static void arm_tick(struct ring *r)
{
    if (without("tick"))
        return;
    r->tick_period.tv_sec = (long long)(IOQ_POLL_NS / 1000000000ull);
    r->tick_period.tv_nsec = (long long)(IOQ_POLL_NS % 1000000000ull);
    struct io_uring_sqe *sqe = &r->sqes[r->sq_local_tail & *r->sq_mask];
    memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = IORING_OP_TIMEOUT;
    sqe->addr = (uint64_t)(uintptr_t)&r->tick_period;
    sqe->len = 1;
    sqe->off = 0; /* no count: it never ends by itself */
    sqe->timeout_flags = IORING_TIMEOUT_MULTISHOT;
    sqe->user_data = TICK_DATA;
    r->sq_local_tail++;
    __atomic_store_n(r->sq_tail, r->sq_local_tail, __ATOMIC_RELEASE);
    unsigned flags = r->ring_index >= 0 ? IORING_ENTER_REGISTERED_RING : 0;
    if (sys_enter(r->ring_index >= 0 ? r->ring_index : r->fd, 1, 0, flags, NULL, 0) != 1)
        return;
    r->tick = 1;
    /* a refusal is completed within the submission */
    unsigned head = *r->cq_head;
    if (head != __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE) &&
        r->cqes[head & *r->cq_mask].user_data == TICK_DATA) {
        r->tick = 0;
        __atomic_store_n(r->cq_head, head + 1, __ATOMIC_RELEASE);
    }
}

static void uring_close(void *state, int wedged)
{
    struct ring *r = state;
    if (!r)
        return;
    /* A kept ring's tick ends by itself: its next completion, with deferred task work, is
     * posted (and the tick armed again) only when its thread waits on the ring again */
    if (wedged)
        return; /* the kernel still holds I/Os into these buffers: keep the ring and them */
    if (r->sqes)
        munmap(r->sqes, r->sqes_len);
    if (r->cq_map && r->cq_map != r->sq_map)
        munmap(r->cq_map, r->cq_map_len);
    if (r->sq_map)
        munmap(r->sq_map, r->sq_map_len);
    /* The kernel tears a closed ring down later, holding its registered files until then: an
     * exclusive reopen (O_EXCL) or an unmount right after would find the file busy.
     * Unregistering waits until the ring no longer uses them. */
    if (r->fd >= 0 && r->fixed_file)
        sys_register(r->fd, IORING_UNREGISTER_FILES, NULL, 0);
    if (r->ring_index >= 0) { /* a task holds 16 at most: give the slot back */
        struct io_uring_rsrc_update up;
        memset(&up, 0, sizeof(up));
        up.offset = (unsigned)r->ring_index;
        sys_register(r->fd, IORING_UNREGISTER_RING_FDS, &up, 1);
    }
    if (r->fd >= 0)
        close(r->fd);
    free(r);
}

/* Whether the kernel can issue an I/O on fd without blocking the submitter (FMODE_NOWAIT, which
 * user space cannot read): block devices and the local filesystems that support it. On any
 * other (FUSE, NFS, overlay …) io_uring issues a read inline in io_uring_enter, and a target
 * that stops answering holds the submitting thread there, where the queue's stall clock never
 * runs; forced-async issue hands each I/O to the kernel's io-wq workers instead, and the
 * queue's own stall error names the I/O (docs/ARCHITECTURE.md §4, "A watchdog"). */
static int issues_without_blocking(int fd)
{
    struct stat st;
    struct statfs fs;
    if (fd < 0 || fstat(fd, &st) != 0 || fstatfs(fd, &fs) != 0)
        return 1; /* nothing to ask: as before */
    if (S_ISBLK(st.st_mode))
        return 1;
    switch ((unsigned long)fs.f_type) {
    case 0xEF53:      /* ext2/3/4 */
    case 0x58465342:  /* xfs */
    case 0x9123683E:  /* btrfs */
    case 0xF2F52010:  /* f2fs */
    case 0x01021994:  /* tmpfs */
        return 1;
    default:
        return 0;
    }
}

static int uring_open(const struct ioq_opts *o, void *bufs, size_t bufs_len, void **state)
{
    struct ring *r = calloc(1, sizeof(*r));
    if (!r)
        return qual_set_error(-ENOMEM, "cannot allocate a ring");
    r->fd = -1;
    r->ring_index = -1;
    r->target_fd = o->fd;
    r->force_async = !issues_without_blocking(o->fd);
    r->buf_len = o->buf_len;
    r->bufs = bufs;
    r->bufs_len = bufs_len;
    if (!r->bufs && o->client_mem) { /* in units the kernel takes (1 GiB a buffer at most) */
        r->bufs = o->client_mem;
        r->bufs_len = o->client_mem_len;
        r->buf_len = o->client_mem_len < (1ul << 30) ? o->client_mem_len : 1ul << 30;
    }
    *state = r;

    struct io_uring_params p;
    r->fd = create_ring(o->depth, &p, o->single_issuer);
    if (r->fd < 0)
        return qual_set_error(-errno, "io_uring_setup(%u): %s", o->depth, strerror(errno));
    int rc = map_rings(r, &p);
    if (rc)
        return rc;
    /* only the task that registered the ring's descriptor may enter by it: a single issuer */
    struct io_uring_rsrc_update up;
    memset(&up, 0, sizeof(up));
    up.offset = -1U; /* any free slot */
    up.data = (uint64_t)r->fd;
    if (o->single_issuer && !without("registered_ring") &&
        sys_register(r->fd, IORING_REGISTER_RING_FDS, &up, 1) == 1)
        r->ring_index = (int)up.offset;
    r->fixed_file = r->target_fd >= 0 && !without("fixed_files") &&
                    sys_register(r->fd, IORING_REGISTER_FILES, &r->target_fd, 1) == 0;
    if (o->single_issuer)
        arm_tick(r);
    if (!r->bufs)
        return 0; /* the client brings its own memory */
    unsigned units = (unsigned)((r->bufs_len + r->buf_len - 1) / r->buf_len);
    struct iovec *iov = calloc(units, sizeof(*iov));
    if (!iov)
        return qual_set_error(-ENOMEM, "cannot allocate %u iovecs", units);
    for (unsigned i = 0; i < units; i++) {
        iov[i].iov_base = r->bufs + (size_t)i * r->buf_len;
        iov[i].iov_len = r->bufs_len - (size_t)i * r->buf_len < r->buf_len ?
                         r->bufs_len - (size_t)i * r->buf_len : r->buf_len;
    }
    /* registered buffers save a page pin per I/O; without them (a locked-memory limit, an old
     * kernel) plain reads and writes work */
    r->fixed_bufs = units <= UINT16_MAX + 1u && !without("fixed_buffers") &&
                    sys_register(r->fd, IORING_REGISTER_BUFFERS, iov, units) == 0;
    free(iov);
    return 0;
}

static int uring_set_fd(void *state, int fd)
{
    struct ring *r = state;
    if (r->fixed_file) {
        struct io_uring_files_update up;
        memset(&up, 0, sizeof(up));
        up.offset = 0;
        up.fds = (uint64_t)(uintptr_t)&fd;
        if (sys_register(r->fd, IORING_REGISTER_FILES_UPDATE, &up, 1) != 1)
            r->fixed_file = 0; /* plain descriptors work as well, a little slower */
    } else if (r->target_fd < 0 && !without("fixed_files") &&
               sys_register(r->fd, IORING_REGISTER_FILES, &fd, 1) == 0) {
        r->fixed_file = 1;
    }
    r->target_fd = fd;
    r->force_async = !issues_without_blocking(fd);
    return 0;
}

static void uring_queue(void *state, struct ioq_io *io)
{
    struct ring *r = state;
    struct io_uring_sqe *sqe = &r->sqes[r->sq_local_tail & *r->sq_mask];
    memset(sqe, 0, sizeof(*sqe));
    const int write = io->op == QUAL_OP_WRITE;
    unsigned char *b = io->buf;
    if (io->iov) {
        sqe->opcode = write ? IORING_OP_WRITEV : IORING_OP_READV;
        sqe->addr = (uint64_t)(uintptr_t)io->iov;
        sqe->len = io->nvec;
    } else {
        int fixed = r->fixed_bufs && b >= r->bufs && b + io->len <= r->bufs + r->bufs_len &&
                    (size_t)(b - r->bufs) / r->buf_len ==
                    (size_t)(b + io->len - 1 - r->bufs) / r->buf_len; /* inside one unit */
        if (fixed) {
            sqe->opcode = write ? IORING_OP_WRITE_FIXED : IORING_OP_READ_FIXED;
            sqe->buf_index = (unsigned short)((size_t)(b - r->bufs) / r->buf_len);
        } else {
            sqe->opcode = write ? IORING_OP_WRITE : IORING_OP_READ;
        }
        sqe->addr = (uint64_t)(uintptr_t)b;
        sqe->len = io->len;
    }
    if (r->fixed_file) {
        sqe->fd = 0;
        sqe->flags = IOSQE_FIXED_FILE;
    } else {
        sqe->fd = r->target_fd;
    }
    if (r->force_async)
        sqe->flags |= IOSQE_ASYNC;
    sqe->off = io->off;
    sqe->user_data = io->slot;
    r->sq_local_tail++;
}

static unsigned uring_pending(void *state)
{
    struct ring *r = state;
    return r->sq_local_tail - __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
}

static int uring_enter(void *state, int submit, int wait, uint64_t timeout_ns)
{
    struct ring *r = state;
    if (submit)
        __atomic_store_n(r->sq_tail, r->sq_local_tail, __ATOMIC_RELEASE);
    unsigned to_submit = submit ? uring_pending(r) : 0;
    unsigned ready = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE) - *r->cq_head;
    if (ready)
        wait = 0; /* completions are there already: just hand the new ones over */
    if (!to_submit && !wait)
        return 0;
    struct __kernel_timespec ts = {(long long)(timeout_ns / 1000000000ull),
                                   (long long)(timeout_ns % 1000000000ull)};
    struct io_uring_getevents_arg arg;
    memset(&arg, 0, sizeof(arg));
    arg.ts = (uint64_t)(uintptr_t)&ts;
    /* a timeout's completion ends any wait, however many it waits for: with the tick, a
     * wait ends within IOQ_POLL_NS without a timer of its own */
    int timed = wait && !r->tick;
    unsigned flags = wait ? IORING_ENTER_GETEVENTS : 0;
    if (timed)
        flags |= IORING_ENTER_EXT_ARG;
    if (r->ring_index >= 0)
        flags |= IORING_ENTER_REGISTERED_RING;
    int ret = sys_enter(r->ring_index >= 0 ? r->ring_index : r->fd, to_submit,
                        wait > 0 ? (unsigned)wait : 0, flags, timed ? &arg : NULL,
                        timed ? sizeof(arg) : 0);
    if (ret >= 0)
        return 0;
    int err = errno;
    if (err == ETIME || err == EAGAIN || err == EBUSY || err == EINTR)
        return -err;
    return qual_set_error(-err, "io_uring_enter: %s", strerror(err));
}

static int uring_reap(void *state, unsigned *slot, int64_t *res)
{
    struct ring *r = state;
    for (;;) {
        unsigned head = *r->cq_head;
        if (head == __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE))
            return 0;
        const struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
        uint64_t data = cqe->user_data;
        *slot = (unsigned)data;
        *res = cqe->res;
        if (data == TICK_DATA && !(cqe->flags & IORING_CQE_F_MORE))
            r->tick = 0; /* the tick ended: the waits take their own timeouts again */
        __atomic_store_n(r->cq_head, head + 1, __ATOMIC_RELEASE);
        if (data != TICK_DATA)
            return 1;
    }
}

const struct ioq_backend ioq_uring_backend = {
    .probe = uring_probe,
    .open = uring_open,
    .set_fd = uring_set_fd,
    .queue = uring_queue,
    .enter = uring_enter,
    .reap = uring_reap,
    .pending = uring_pending,
    .close = uring_close,
};
