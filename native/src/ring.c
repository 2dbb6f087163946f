/* ring.c — the io_uring backend, by raw syscalls (no liburing): one ring per worker, the
 * worker's descriptor and buffers registered with the kernel, fixed-buffer reads and writes. */
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

struct slot {
    uint64_t off;
    uint64_t t_submit;
    unsigned char *buf;
};

struct ring_state {
    int fd;
    unsigned features;
    int fixed_file;
    int fixed_bufs;
    int target_fd;
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
    /* I/O slots */
    unsigned depth;
    struct slot *slots;
    unsigned *free_slots;
    unsigned nfree;
    unsigned char *bufs;
};

static int sys_setup(unsigned entries, struct io_uring_params *p)
{
    return (int)syscall(__NR_io_uring_setup, entries, p);
}

static int sys_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags,
                     void *arg, size_t argsz)
{
    return (int)syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, arg, argsz);
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

/* Newer setup flags cut the cost of completions; older kernels refuse them with EINVAL. */
static int create_ring(unsigned entries, struct io_uring_params *p)
{
    static const unsigned tries[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
        IORING_SETUP_COOP_TASKRUN,
        0,
    };
    int fd = -1;
    for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
        memset(p, 0, sizeof(*p));
        p->flags = tries[i];
        fd = sys_setup(entries, p);
        if (fd >= 0 || errno != EINVAL)
            break;
    }
    return fd;
}

static int map_rings(struct ring_state *rs, const struct io_uring_params *p)
{
    rs->sq_map_len = p->sq_off.array + p->sq_entries * sizeof(unsigned);
    rs->cq_map_len = p->cq_off.cqes + p->cq_entries * sizeof(struct io_uring_cqe);
    int single = (p->features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single && rs->cq_map_len > rs->sq_map_len)
        rs->sq_map_len = rs->cq_map_len;
    rs->sq_map = mmap(NULL, rs->sq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                      rs->fd, IORING_OFF_SQ_RING);
    if (rs->sq_map == MAP_FAILED) {
        rs->sq_map = NULL;
        return qual_set_error(-errno, "mmap io_uring SQ ring: %s", strerror(errno));
    }
    if (single) {
        rs->cq_map = rs->sq_map;
        rs->cq_map_len = 0;
    } else {
        rs->cq_map = mmap(NULL, rs->cq_map_len, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_POPULATE, rs->fd, IORING_OFF_CQ_RING);
        if (rs->cq_map == MAP_FAILED) {
            rs->cq_map = NULL;
            return qual_set_error(-errno, "mmap io_uring CQ ring: %s", strerror(errno));
        }
    }
    rs->sqes_len = p->sq_entries * sizeof(struct io_uring_sqe);
    rs->sqes = mmap(NULL, rs->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                    rs->fd, IORING_OFF_SQES);
    if (rs->sqes == MAP_FAILED) {
        rs->sqes = NULL;
        return qual_set_error(-errno, "mmap io_uring SQEs: %s", strerror(errno));
    }
    unsigned char *sq = rs->sq_map;
    unsigned char *cq = rs->cq_map;
    rs->sq_head = (unsigned *)(sq + p->sq_off.head);
    rs->sq_tail = (unsigned *)(sq + p->sq_off.tail);
    rs->sq_mask = (unsigned *)(sq + p->sq_off.ring_mask);
    unsigned *array = (unsigned *)(sq + p->sq_off.array);
    for (unsigned i = 0; i < p->sq_entries; i++)
        array[i] = i; /* SQE i always sits in array slot i */
    rs->sq_local_tail = *rs->sq_tail;
    rs->cq_head = (unsigned *)(cq + p->cq_off.head);
    rs->cq_tail = (unsigned *)(cq + p->cq_off.tail);
    rs->cq_mask = (unsigned *)(cq + p->cq_off.ring_mask);
    rs->cqes = (struct io_uring_cqe *)(cq + p->cq_off.cqes);
    return 0;
}

void ring_teardown(struct ring_state *rs)
{
    if (!rs)
        return;
    if (rs->sqes)
        munmap(rs->sqes, rs->sqes_len);
    if (rs->cq_map && rs->cq_map != rs->sq_map)
        munmap(rs->cq_map, rs->cq_map_len);
    if (rs->sq_map)
        munmap(rs->sq_map, rs->sq_map_len);
    if (rs->fd >= 0)
        close(rs->fd);
    free(rs->bufs);
    free(rs->slots);
    free(rs->free_slots);
    free(rs);
}

static int setup_buffers(struct stream *s, struct ring_state *rs)
{
    const struct qual_job *job = s->run->job;
    size_t bs = job->block_size;
    size_t align = job->align > 4096 ? job->align : 4096;
    void *mem = NULL;
    int rc = posix_memalign(&mem, align, bs * rs->depth);
    if (rc)
        return qual_set_error(-rc, "cannot allocate %u x %zu bytes of I/O buffers", rs->depth, bs);
    rs->bufs = mem;
    if (job->op == QUAL_OP_WRITE)
        qual_fill_random(rs->bufs, bs * rs->depth, job->seed ^ mix64(0x5eed0000u + s->w->index));
    else
        memset(rs->bufs, 0, bs * rs->depth);
    rs->slots = calloc(rs->depth, sizeof(*rs->slots));
    rs->free_slots = calloc(rs->depth, sizeof(*rs->free_slots));
    struct iovec *iov = calloc(rs->depth, sizeof(*iov));
    if (!rs->slots || !rs->free_slots || !iov) {
        free(iov);
        return qual_set_error(-ENOMEM, "cannot allocate %u I/O slots", rs->depth);
    }
    for (unsigned i = 0; i < rs->depth; i++) {
        rs->slots[i].buf = rs->bufs + (size_t)i * bs;
        rs->free_slots[i] = rs->depth - 1 - i;
        iov[i].iov_base = rs->slots[i].buf;
        iov[i].iov_len = bs;
    }
    rs->nfree = rs->depth;
    /* registered buffers save a page pin per I/O; without them plain reads and writes work */
    rs->fixed_bufs = sys_register(rs->fd, IORING_REGISTER_BUFFERS, iov, rs->depth) == 0;
    free(iov);
    return 0;
}

int ring_setup(struct stream *s, struct ring_state **out)
{
    const struct qual_job *job = s->run->job;
    struct ring_state *rs = calloc(1, sizeof(*rs));
    if (!rs)
        return qual_set_error(-ENOMEM, "cannot allocate a ring");
    rs->fd = -1;
    rs->depth = job->queue_depth;
    rs->target_fd = s->w->fd;
    *out = rs;

    struct io_uring_params p;
    rs->fd = create_ring(rs->depth, &p);
    if (rs->fd < 0)
        return qual_set_error(-errno, "io_uring_setup(%u): %s", rs->depth, strerror(errno));
    rs->features = p.features;
    int rc = map_rings(rs, &p);
    if (rc)
        return rc;
    rs->fixed_file = sys_register(rs->fd, IORING_REGISTER_FILES, &rs->target_fd, 1) == 0;
    return setup_buffers(s, rs);
}

static void queue_io(struct ring_state *rs, int op, unsigned slot, uint32_t len)
{
    struct slot *sl = &rs->slots[slot];
    unsigned idx = rs->sq_local_tail & *rs->sq_mask;
    struct io_uring_sqe *sqe = &rs->sqes[idx];
    memset(sqe, 0, sizeof(*sqe));
    if (rs->fixed_bufs) {
        sqe->opcode = op == QUAL_OP_WRITE ? IORING_OP_WRITE_FIXED : IORING_OP_READ_FIXED;
        sqe->buf_index = (unsigned short)slot;
    } else {
        sqe->opcode = op == QUAL_OP_WRITE ? IORING_OP_WRITE : IORING_OP_READ;
    }
    if (rs->fixed_file) {
        sqe->fd = 0;
        sqe->flags = IOSQE_FIXED_FILE;
    } else {
        sqe->fd = rs->target_fd;
    }
    sqe->addr = (uint64_t)(uintptr_t)sl->buf;
    sqe->len = len;
    sqe->off = sl->off;
    sqe->user_data = slot;
    rs->sq_local_tail++;
    sl->t_submit = now_ns();
}

/* SQEs queued but not yet taken by the kernel */
static unsigned pending(const struct ring_state *rs)
{
    return rs->sq_local_tail - __atomic_load_n(rs->sq_head, __ATOMIC_ACQUIRE);
}

/* Hand the queued SQEs to the kernel without waiting for completions; 0 or -errno. */
static int submit(struct jobrun *run, struct ring_state *rs, int op)
{
    __atomic_store_n(rs->sq_tail, rs->sq_local_tail, __ATOMIC_RELEASE);
    int ret = sys_enter(rs->fd, pending(rs), 0, 0, NULL, 0);
    if (ret < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY)
        return job_fail(run, -errno, op, 0, "io_uring_enter: %s", strerror(errno));
    return 0;
}

int ring_run(struct stream *s, struct ring_state *rs)
{
    struct jobrun *run = s->run;
    const struct qual_job *job = run->job;
    const int op = job->op;
    const uint32_t len = job->block_size;
    const unsigned batch = job->submit_batch;
    unsigned inflight = 0;  /* queued in the ring or with the kernel */
    int draining = 0;
    int submit_failed = 0; /* after a hard io_uring_enter error only wait for what was taken */

    for (;;) {
        while (!draining && inflight < rs->depth) {
            uint64_t off;
            if (!job_claim(s, &off)) {
                draining = 1;
                break;
            }
            unsigned slot = rs->free_slots[--rs->nfree];
            rs->slots[slot].off = off;
            if (op == QUAL_OP_WRITE)
                job_prepare_write(s, rs->slots[slot].buf, off);
            queue_io(rs, op, slot, len);
            inflight++;
            /* a full batch goes to the kernel at once, without waiting; the last one of the
             * round goes with the wait below */
            if (batch && inflight < rs->depth && pending(rs) >= batch && submit(run, rs, op)) {
                submit_failed = 1;
                draining = 1;
            }
        }
        if (inflight == 0)
            break;
        __atomic_store_n(rs->sq_tail, rs->sq_local_tail, __ATOMIC_RELEASE);
        if (submit_failed && inflight == pending(rs))
            break; /* everything the kernel took is back; the rest was never submitted */
        unsigned to_submit = submit_failed ? 0 : pending(rs);
        unsigned ready = __atomic_load_n(rs->cq_tail, __ATOMIC_ACQUIRE) - *rs->cq_head;
        /* Waiting has no timeout: an in-flight I/O must come back before its buffer can be
         * reused or freed, so a cancel or a deadline is acted on at the next completion. */
        int ret = sys_enter(rs->fd, to_submit, ready ? 0 : 1, IORING_ENTER_GETEVENTS, NULL, 0);
        if (ret < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY) {
            job_fail(run, -errno, op, 0, "io_uring_enter: %s", strerror(errno));
            /* the kernel still owns what it took: keep reaping until it is back */
            submit_failed = 1;
            draining = 1;
        }

        unsigned head = *rs->cq_head;
        unsigned tail = __atomic_load_n(rs->cq_tail, __ATOMIC_ACQUIRE);
        if (head == tail)
            continue;
        uint64_t now = now_ns();
        for (; head != tail; head++) {
            const struct io_uring_cqe *cqe = &rs->cqes[head & *rs->cq_mask];
            unsigned slot = (unsigned)cqe->user_data;
            struct slot *sl = &rs->slots[slot];
            if (job_complete(s, op, sl->off, cqe->res, now - sl->t_submit, sl->buf) != 0)
                draining = 1;
            rs->free_slots[rs->nfree++] = slot;
            inflight--;
        }
        __atomic_store_n(rs->cq_head, head, __ATOMIC_RELEASE);
        if (job_stopping(run))
            draining = 1;
    }
    return 0;
}
