/* ring.c — io_uring by raw syscalls (no liburing): a ring bound to one descriptor with its
 * I/O buffers registered, the primitives to queue, submit and reap fixed-buffer reads and
 * writes, and the job streams' loop built on them. */
#include <errno.h>
#include <linux/io_uring.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

struct ring {
    int fd;
    int target_fd;
    int fixed_file;
    int fixed_bufs;
    unsigned depth;
    unsigned char *bufs;
    size_t buf_len;
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

static int sys_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags)
{
    return (int)syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, NULL, 0);
}

static int sys_register(int fd, unsigned opcode, const void *arg, unsigned nr)
{
    return (int)syscall(__NR_io_uring_register, fd, opcode, arg, nr);
}

int qual_io_uring_probe(void)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    int fd = sys_setup(1, &p);
    if (fd < 0)
        return qual_set_error(-errno, "io_uring_setup: %s", strerror(errno));
    close(fd);
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
    int fd = -1;
    for (size_t i = single_issuer ? 0 : 1; i < sizeof(tries) / sizeof(tries[0]); i++) {
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

void ring_close(struct ring *r)
{
    if (!r)
        return;
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
    if (r->fd >= 0)
        close(r->fd);
    free(r->bufs);
    free(r);
}

int ring_open(struct ring **out, int target_fd, unsigned depth, size_t buf_len, size_t align,
              int single_issuer)
{
    struct ring *r = calloc(1, sizeof(*r));
    if (!r)
        return qual_set_error(-ENOMEM, "cannot allocate a ring");
    r->fd = -1;
    r->depth = depth;
    r->target_fd = target_fd;
    r->buf_len = buf_len;
    *out = r;

    struct io_uring_params p;
    r->fd = create_ring(depth, &p, single_issuer);
    if (r->fd < 0)
        return qual_set_error(-errno, "io_uring_setup(%u): %s", depth, strerror(errno));
    int rc = map_rings(r, &p);
    if (rc)
        return rc;
    r->fixed_file = sys_register(r->fd, IORING_REGISTER_FILES, &r->target_fd, 1) == 0;

    if (buf_len == 0)
        return 0; /* the caller brings its own memory (ring_queue_vec) */
    void *mem = NULL;
    if (align < 4096)
        align = 4096;
    rc = posix_memalign(&mem, align, buf_len * depth);
    if (rc)
        return qual_set_error(-rc, "cannot allocate %u x %zu bytes of I/O buffers", depth, buf_len);
    r->bufs = mem;
    memset(r->bufs, 0, buf_len * depth); /* fault the pages in before they are pinned */
    struct iovec *iov = calloc(depth, sizeof(*iov));
    if (!iov)
        return qual_set_error(-ENOMEM, "cannot allocate %u iovecs", depth);
    for (unsigned i = 0; i < depth; i++) {
        iov[i].iov_base = ring_buf(r, i);
        iov[i].iov_len = buf_len;
    }
    /* registered buffers save a page pin per I/O; without them plain reads and writes work */
    r->fixed_bufs = sys_register(r->fd, IORING_REGISTER_BUFFERS, iov, depth) == 0;
    free(iov);
    return 0;
}

int ring_set_file(struct ring *r, int target_fd)
{
    r->target_fd = target_fd;
    if (!r->fixed_file)
        return 0;
    struct io_uring_files_update up;
    memset(&up, 0, sizeof(up));
    up.offset = 0;
    up.fds = (uint64_t)(uintptr_t)&r->target_fd;
    if (sys_register(r->fd, IORING_REGISTER_FILES_UPDATE, &up, 1) != 1)
        r->fixed_file = 0; /* plain descriptors work as well, a little slower */
    return 0;
}

void *ring_buf(struct ring *r, unsigned slot)
{
    return r->bufs + (size_t)slot * r->buf_len;
}

void ring_queue(struct ring *r, int op, unsigned slot, uint64_t off, uint32_t len)
{
    struct io_uring_sqe *sqe = &r->sqes[r->sq_local_tail & *r->sq_mask];
    memset(sqe, 0, sizeof(*sqe));
    if (r->fixed_bufs) {
        sqe->opcode = op == QUAL_OP_WRITE ? IORING_OP_WRITE_FIXED : IORING_OP_READ_FIXED;
        sqe->buf_index = (unsigned short)slot;
    } else {
        sqe->opcode = op == QUAL_OP_WRITE ? IORING_OP_WRITE : IORING_OP_READ;
    }
    if (r->fixed_file) {
        sqe->fd = 0;
        sqe->flags = IOSQE_FIXED_FILE;
    } else {
        sqe->fd = r->target_fd;
    }
    sqe->addr = (uint64_t)(uintptr_t)ring_buf(r, slot);
    sqe->len = len;
    sqe->off = off;
    sqe->user_data = slot;
    r->sq_local_tail++;
}

void ring_queue_vec(struct ring *r, int op, uint64_t user_data, const struct iovec *iov,
                    unsigned nvec, uint64_t off)
{
    struct io_uring_sqe *sqe = &r->sqes[r->sq_local_tail & *r->sq_mask];
    memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = op == QUAL_OP_WRITE ? IORING_OP_WRITEV : IORING_OP_READV;
    if (r->fixed_file) {
        sqe->fd = 0;
        sqe->flags = IOSQE_FIXED_FILE;
    } else {
        sqe->fd = r->target_fd;
    }
    sqe->addr = (uint64_t)(uintptr_t)iov;
    sqe->len = nvec;
    sqe->off = off;
    sqe->user_data = user_data;
    r->sq_local_tail++;
}

unsigned ring_pending(const struct ring *r)
{
    return r->sq_local_tail - __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
}

int ring_submit(struct ring *r, unsigned wait)
{
    __atomic_store_n(r->sq_tail, r->sq_local_tail, __ATOMIC_RELEASE);
    unsigned ready = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE) - *r->cq_head;
    unsigned flags = wait ? IORING_ENTER_GETEVENTS : 0;
    /* No timeout: an in-flight I/O must come back before its buffer can be reused or freed,
     * so a cancel or a deadline is acted on at the next completion. */
    int ret = sys_enter(r->fd, ring_pending(r), ready ? 0 : wait, flags);
    if (ret < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY)
        return qual_set_error(-errno, "io_uring_enter: %s", strerror(errno));
    return 0;
}

int ring_wait(struct ring *r)
{
    unsigned ready = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE) - *r->cq_head;
    int ret = sys_enter(r->fd, 0, ready ? 0 : 1, IORING_ENTER_GETEVENTS);
    if (ret < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY)
        return qual_set_error(-errno, "io_uring_enter: %s", strerror(errno));
    return 0;
}

int ring_reap(struct ring *r, uint64_t *user_data, int32_t *res)
{
    unsigned head = *r->cq_head;
    if (head == __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE))
        return 0;
    const struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
    *user_data = cqe->user_data;
    *res = cqe->res;
    __atomic_store_n(r->cq_head, head + 1, __ATOMIC_RELEASE);
    return 1;
}

/* ---------------------------------------------------------------- job streams */

struct ring_state {
    struct ring *ring;
    uint64_t *off;      /* per slot */
    uint64_t *t_submit; /* per slot */
    unsigned *free_slots;
    unsigned nfree;
};

void ring_teardown(struct ring_state *rs)
{
    if (!rs)
        return;
    ring_close(rs->ring);
    free(rs->off);
    free(rs->t_submit);
    free(rs->free_slots);
    free(rs);
}

int ring_setup(struct stream *s, struct ring_state **out)
{
    const struct qual_job *job = s->run->job;
    struct ring_state *rs = calloc(1, sizeof(*rs));
    if (!rs)
        return qual_set_error(-ENOMEM, "cannot allocate a ring");
    *out = rs;
    unsigned depth = job->queue_depth;
    int rc = ring_open(&rs->ring, s->w->fd, depth, job->block_size, job->align, 1);
    if (rc)
        return rc;
    rs->off = calloc(depth, sizeof(*rs->off));
    rs->t_submit = calloc(depth, sizeof(*rs->t_submit));
    rs->free_slots = calloc(depth, sizeof(*rs->free_slots));
    if (!rs->off || !rs->t_submit || !rs->free_slots)
        return qual_set_error(-ENOMEM, "cannot allocate %u I/O slots", depth);
    for (unsigned i = 0; i < depth; i++)
        rs->free_slots[i] = depth - 1 - i;
    rs->nfree = depth;
    if (job->op == QUAL_OP_WRITE)
        qual_fill_random(ring_buf(rs->ring, 0), (uint64_t)job->block_size * depth,
                         job->seed ^ mix64(0x5eed0000u + s->w->index));
    return 0;
}

int ring_run(struct stream *s, struct ring_state *rs)
{
    struct jobrun *run = s->run;
    const struct qual_job *job = run->job;
    struct ring *r = rs->ring;
    const int op = job->op;
    const unsigned depth = job->queue_depth;
    const unsigned batch = job->submit_batch;
    unsigned inflight = 0;  /* queued in the ring or with the kernel */
    int draining = 0;
    int submit_failed = 0; /* after a hard io_uring_enter error only wait for what was taken */

    for (;;) {
        while (!draining && inflight < depth) {
            uint64_t off;
            if (!job_claim(s, &off)) {
                draining = 1;
                break;
            }
            unsigned slot = rs->free_slots[--rs->nfree];
            rs->off[slot] = off;
            if (op == QUAL_OP_WRITE)
                job_prepare_write(s, ring_buf(r, slot), off);
            ring_queue(r, op, slot, off, job->block_size);
            rs->t_submit[slot] = now_ns();
            inflight++;
            /* a full batch goes to the kernel at once, without waiting; the last one of the
             * round goes with the wait below */
            if (batch && inflight < depth && ring_pending(r) >= batch) {
                int rc = ring_submit(r, 0);
                if (rc) {
                    job_fail(run, rc, op, 0, "%s", qual_last_error());
                    submit_failed = draining = 1;
                }
            }
        }
        if (inflight == 0)
            break;
        if (submit_failed && inflight == ring_pending(r))
            break; /* everything the kernel took is back; the rest was never submitted */
        int rc = submit_failed ? ring_wait(r) : ring_submit(r, 1);
        if (rc) {
            job_fail(run, rc, op, 0, "%s", qual_last_error());
            /* the kernel still owns what it took: keep reaping until it is back */
            submit_failed = draining = 1;
        }
        uint64_t slot;
        int32_t res;
        uint64_t now = 0;
        while (ring_reap(r, &slot, &res)) {
            if (!now)
                now = now_ns();
            if (job_complete(s, op, rs->off[slot], res, now - rs->t_submit[slot],
                             ring_buf(r, slot)) != 0)
                draining = 1;
            rs->free_slots[rs->nfree++] = (unsigned)slot;
            inflight--;
        }
        if (job_stopping(run))
            draining = 1;
    }
    return 0;
}
