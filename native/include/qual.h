/* qual.h — the whole public C API of libqual, the native I/O engine of qual.
 *
 * Conventions (docs/ARCHITECTURE.md §3):
 *   - every function returns 0 or a negative errno; outputs go through pointers;
 *   - context for the last failure on the calling thread is in qual_last_error();
 *     a job's failure (which may happen on a worker thread) is in its qual_result;
 *   - the engine never allocates memory that it hands to the caller.
 *
 * The cffi cdef is this file with the preprocessor lines removed (qual/_build.py), so keep
 * it to plain C declarations: no macros, no inline functions, no attributes.
 */
#ifndef QUAL_H
#define QUAL_H

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- errors */

/* Context for the last failure of a qual_* call on the calling thread ("" if none). */
const char *qual_last_error(void);

/* ---------------------------------------------------------------- latency histogram (hist.c) */

/* Log-linear buckets: values below 128 ns are exact; above, each power of two is split in
 * 64 buckets, so a bucket's midpoint is within 1/128 (0.78 %) of every value in it, as in
 * fio's stat.h (FIO_IO_U_PLAT_BITS = 6). The last bucket starts at 2^40 ns (~18 min) and
 * collects everything longer; max is tracked exactly. */
enum {
    QUAL_HIST_SUB_BITS = 6,
    QUAL_HIST_BUCKETS = 2304
};

struct qual_hist {
    uint64_t count;
    uint64_t sum_ns;
    uint64_t min_ns;
    uint64_t max_ns;
    uint64_t buckets[2304];
};

int qual_hist_init(struct qual_hist *h);
int qual_hist_record(struct qual_hist *h, uint64_t ns);
int qual_hist_merge(struct qual_hist *dst, const struct qual_hist *src);
/* Nearest-rank percentile (0 < pct <= 100) read from the buckets, clamped to [min, max]. */
int qual_hist_percentile(const struct qual_hist *h, double pct, uint64_t *ns);
/* The value that bucket i stands for (its midpoint), and the bucket a value falls in. */
int qual_hist_bucket_value(uint32_t i, uint64_t *ns);
int qual_hist_bucket_of(uint64_t ns, uint32_t *i);

/* ---------------------------------------------------------------- data patterns (pattern.c) */

/* Incompressible bytes from a seeded PRNG (xoshiro256**). */
int qual_fill_random(void *buf, uint64_t len, uint64_t seed);

/* The verification pattern: every 512-byte unit at absolute target offset O holds O and the
 * seed as little-endian uint64 values, then 496 PRNG bytes derived from (seed, O). The
 * pattern of a range does not depend on the block size it was written with. buf, len and
 * offset must be multiples of 512. */
int qual_pattern_fill(void *buf, uint64_t len, uint64_t seed, uint64_t offset);
/* 0 when buf holds the pattern; -EBADMSG otherwise, with the target offset of the first bad
 * 512-byte unit in *bad_offset. */
int qual_pattern_check(const void *buf, uint64_t len, uint64_t seed, uint64_t offset,
                       uint64_t *bad_offset);

/* ---------------------------------------------------------------- fault injection (fault.c) */

/* A fault rule, applied when an I/O completes (docs/ARCHITECTURE.md §3). An I/O matches when its
 * op is `op` (or op is -1) and its byte range intersects [offset_lo, offset_hi). Every `every`-th
 * matching I/O (1 = each) is hit, at most `limit` times (0 = no limit). A hit completes the I/O
 * with -error (when error != 0), or with short_bytes transferred (when short_bytes != 0), and is
 * delayed by delay_ns before the engine sees it. */
struct qual_fault {
    int op;
    int error;
    uint64_t offset_lo;
    uint64_t offset_hi;
    uint32_t every;
    uint32_t limit;
    uint32_t short_bytes;
    uint64_t delay_ns;
    uint64_t seen;      /* engine-owned: matching I/Os so far */
    uint64_t hits;      /* engine-owned: I/Os this rule changed */
};

/* ---------------------------------------------------------------- I/O jobs (job.c, ring.c, psync.c) */

/* A bound that does not bound: the byte or time bound of a job that has none. Never 0, which
 * is a bound (nothing to do) and is refused. */
#define QUAL_UNBOUNDED UINT64_MAX

/* Limits of a job (and of every queue): I/Os in flight, workers, bytes per I/O. */
enum {
    QUAL_MAX_DEPTH = 4096,
    QUAL_MAX_WORKERS = 1024,
    QUAL_MAX_BLOCK = 67108864
};

/* An I/O's direction; a job's op may also be QUAL_OP_MIXED: reads and writes, rwmixread per
 * cent of them reads, each I/O's direction drawn at random (fio's rw=randrw / rw=rw). */
enum qual_op { QUAL_OP_READ = 0, QUAL_OP_WRITE = 1, QUAL_OP_MIXED = 2 };

/* The file or device a caller checked before handing its path to the engine (the safety guard,
 * qual's proof that it created a scratch file). With one given, the engine opens the path
 * without following a final symbolic link, and refuses (-EPERM) unless fstat on its own
 * descriptor shows this inode: a path swapped after the check is never written. dev 0 and
 * ino 0: no check. */
struct qual_inode {
    uint64_t dev;
    uint64_t ino;
};
enum qual_pattern { QUAL_SEQUENTIAL = 0, QUAL_RANDOM = 1 };
enum qual_backend { QUAL_BACKEND_AUTO = 0, QUAL_BACKEND_IO_URING = 1, QUAL_BACKEND_PSYNC = 2 };

/* What to run. Random offsets are block-aligned and uniform over the region; sequential
 * workers split the region into contiguous slices and wrap around inside their slice. The job
 * stops at the first bound reached (bytes or runtime; at least one must not be
 * QUAL_UNBOUNDED), on cancel, or on the first error. A byte bound binds every worker: each
 * issues its share (the remainder to the first workers), and a worker whose share is zero
 * issues nothing. */
struct qual_job {
    const char *path;         /* a regular file or a block device */
    int op;                   /* enum qual_op */
    uint32_t rwmixread;       /* QUAL_OP_MIXED: per cent of I/Os that read, 0..100 */
    int pattern;              /* enum qual_pattern */
    int backend;              /* enum qual_backend: the one asked for */
    int direct;               /* 1: O_DIRECT (the page cache is bypassed) */
    int verify;               /* 1: writes lay down the verification pattern, reads check it */
    struct qual_inode expect; /* what the path must open (see struct qual_inode) */
    uint32_t block_size;      /* bytes per I/O, a multiple of align */
    uint32_t queue_depth;     /* I/Os in flight per worker */
    uint32_t workers;         /* threads, one ring (or one pool of queue_depth threads) each */
    uint32_t submit_batch;    /* io_uring: I/Os per submission syscall (0: all that are ready);
                                 1, fio's iodepth_batch_submit default, submits each at once */
    uint32_t align;           /* offset and length alignment: the target's logical block size */
    uint64_t offset;          /* region start, a multiple of align */
    uint64_t size;            /* region size */
    uint64_t bytes;           /* bound: total bytes over all workers, a whole number of
                                 blocks (QUAL_UNBOUNDED: none) */
    uint64_t runtime_ns;      /* bound: wall time (QUAL_UNBOUNDED: none) */
    uint64_t command_timeout_ns; /* an I/O outstanding this long is a stall: the job ends with
                                 -ETIMEDOUT naming it (0: NVMe's default, 30 s) */
    uint64_t seed;            /* random offsets, write data and the verification pattern */
    struct qual_fault *faults;
    uint32_t nfaults;
};

/* Shared with a running job: the caller may set cancel at any time (the job returns
 * -ECANCELED within about 0.1 s); bytes_done and ops_done grow as I/Os complete. */
struct qual_ctl {
    int cancel;
    uint64_t bytes_done;
    uint64_t ops_done;
};

/* One direction's share of a job. */
struct qual_dir {
    uint64_t bytes;
    uint64_t ops;
    struct qual_hist lat;
};

/* What happened. elapsed_ns runs from the moment every worker is ready until the last one
 * finished, including fdatasync for writes (durability is part of a write's time). cpu_*
 * are the whole process's CPU seconds over the same span. */
struct qual_result {
    int backend;              /* the backend used */
    int error;                /* 0, or the negative errno of the first failure */
    int error_op;             /* enum qual_op of the failed I/O, -1 if none */
    uint64_t error_offset;    /* target offset of the failed I/O */
    char error_msg[256];
    uint64_t bytes;
    uint64_t ops;
    uint64_t elapsed_ns;
    double cpu_user_s;
    double cpu_sys_s;
    struct qual_hist lat;     /* completion latency of every I/O, all workers merged */
    struct qual_dir dir[2];   /* the same split by direction (enum qual_op: read, write) */
};

int qual_job_run(const struct qual_job *job, struct qual_ctl *ctl, struct qual_result *res);

/* 0 when io_uring can be used here, else why not (-ENOSYS: kernel without it, -EPERM:
 * disabled by the kernel.io_uring_disabled sysctl or a seccomp policy). */
int qual_io_uring_probe(void);

/* ---------------------------------------------------------------- CRC32C (crc32c.c) */

/* CRC32C (Castagnoli) of buf continuing from crc (0 to start): crc32c(crc32c(0, a), b) is the
 * CRC of a followed by b. Uses the SSE4.2 instruction where the CPU has it. */
int qual_crc32c(uint32_t crc, const void *buf, uint64_t len, uint32_t *out);
int qual_crc32c_hardware(int *yes);

/* ---------------------------------------------------------------- checkpoint files (ckpt.c) */

/* One tensor's bytes in a checkpoint file: caller-owned memory, read from on write and written
 * to on restore. A file's spans are sorted by offset and do not overlap. */
struct qual_span {
    void *data;
    uint64_t offset;
    uint64_t nbytes;
};

/* A checkpoint file: the spans at their offsets with zeros between them, written and read in
 * chunks of chunk_size bytes (the last one shorter), every chunk with its CRC32C. */
struct qual_ckpt_file {
    const char *path;
    int backend;              /* enum qual_backend */
    int direct;               /* 1: O_DIRECT */
    uint32_t align;           /* offset and length alignment of the target */
    uint32_t chunk_size;      /* bytes per I/O and per CRC, a multiple of align */
    uint32_t queue_depth;     /* chunks in flight (io_uring) */
    uint64_t file_size;       /* a multiple of align, covering every span */
    const struct qual_span *spans;
    uint32_t nspans;
    uint32_t *crcs;           /* one per chunk: filled in by write, checked by read */
    uint32_t ncrcs;
    struct qual_fault *faults;
    uint32_t nfaults;
};

struct qual_ckpt_result {
    int backend;              /* the backend used */
    int error;                /* 0, or the negative errno of the first failure */
    int error_op;             /* enum qual_op of the failed I/O, -1 if none */
    uint64_t error_offset;
    char error_msg[256];
    uint64_t bytes;
    uint64_t zero_copy_bytes; /* of which moved straight from (into) the spans' memory */
    uint64_t elapsed_ns;      /* from open to the last byte (write: durable, fdatasync included) */
    uint64_t sync_ns;         /* of which fdatasync */
    double cpu_user_s;        /* whole process, over elapsed_ns */
    double cpu_sys_s;
};

/* A chunk that lies within one span whose memory there is aligned (span memory and file offset
 * congruent modulo align, as a trainer's page-aligned buffers are) moves with no copy: written
 * from the span's memory, read straight into it (its CRC checked there). Other chunks are
 * staged through the queue's aligned buffers. */
/* Create the file (it must not exist yet), preallocate it, write every chunk, fdatasync. */
int qual_ckpt_write(const struct qual_ckpt_file *f, struct qual_ctl *ctl,
                    struct qual_ckpt_result *res);
/* Read every chunk, check its CRC (-EBADMSG on a mismatch), copy it into the spans. */
int qual_ckpt_read(const struct qual_ckpt_file *f, struct qual_ctl *ctl,
                   struct qual_ckpt_result *res);

/* ---------------------------------------------------------------- neighbour sampling (sample.c) */

/* Uniform neighbour sampling over one relation's CSC (indptr has num_dst + 1 entries; the
 * in-neighbours of node v are indices[indptr[v] .. indptr[v+1])). For each of the n_dst nodes in
 * dst, up to fanout distinct neighbours are drawn (all of them when there are no more); the
 * draw depends only on (seed, the node), so it is the same in any order and on any thread.
 * out_src and out_dst_pos take n_dst * fanout entries: the neighbour's id and the index of its
 * dst node in dst; *out_edges is how many were filled. */
int qual_sample(const int64_t *indptr, const int64_t *indices, uint64_t num_dst,
                const int64_t *dst, uint64_t n_dst, uint32_t fanout, uint64_t seed,
                int64_t *out_src, int64_t *out_dst_pos, uint64_t *out_edges);

/* ---------------------------------------------------------------- feature cache (cache.c, gather.c) */

/* A BaM/GIDS-style software page cache over a feature store: a file of `rows` rows of
 * row_bytes each, row i starting at i * row_stride (row_stride a multiple of page_size).
 * Pages are the cache lines and the I/O unit; a full cache evicts by clock, never a page held
 * by the gather in progress, and a page pinned by the window (wanted by a batch sampled ahead)
 * only when no other page is left.
 * Rows in the CPU buffer are served from it without I/O. Not thread-safe: one user at a time. */
struct qual_fcache;

struct qual_fcache_opts {
    const char *path;
    uint64_t rows;
    uint32_t row_bytes;
    uint32_t row_stride;
    uint32_t page_size;       /* cache line and I/O size (GIDS: 4096) */
    uint64_t capacity;        /* pages the cache holds */
    uint32_t queue_depth;     /* reads in flight */
    uint32_t max_coalesce;    /* adjacent missing pages merged into one read, at most */
    int backend;              /* enum qual_backend */
    int direct;               /* 1: O_DIRECT */
};

/* Counters since open or the last reset. A row lookup is an access per page it spans;
 * accesses = hits + misses; a miss is a page read from the store, once per gather however many
 * rows want it; cpu_hits are rows served by the CPU buffer (not accesses). */
struct qual_fcache_stats {
    uint64_t accesses;
    uint64_t hits;
    uint64_t misses;
    uint64_t cpu_hits;
    uint64_t reads;           /* read requests issued (coalesced pages count once) */
    uint64_t read_bytes;
    uint64_t evictions;
    uint64_t pinned_evictions; /* of which pages still wanted by the window (cache too small) */
    uint64_t writes;          /* always 0: the cache never writes the store */
    uint64_t pinned_pages;    /* pages with window pins now */
    uint64_t io_ns;           /* time gathers spent reading and copying (they overlap) */
};

int qual_fcache_open(const struct qual_fcache_opts *o, struct qual_fcache **out);
int qual_fcache_close(struct qual_fcache *c);
/* Serve these rows from buffer (caller-owned, n * row_bytes), filled here from the store. */
int qual_fcache_set_cpu_buffer(struct qual_fcache *c, const int64_t *rows, uint64_t n,
                               void *buffer);
/* Window buffering: delta +1 pins the pages of a batch sampled ahead, -1 unpins them when the
 * batch is used. */
int qual_fcache_window(struct qual_fcache *c, const int64_t *rows, uint64_t n, int delta);
/* Copy rows (n of them, any order, repeats allowed) into dst (n * row_bytes, caller-owned),
 * reading what is not cached: each page once, queue_depth in flight, windows of missing pages
 * sorted and adjacent ones coalesced, rows copied out as their pages land. The cache's ring is
 * made for the thread that gathers (remade if another thread gathers next). */
int qual_fcache_gather(struct qual_fcache *c, const int64_t *rows, uint64_t n, void *dst,
                       struct qual_ctl *ctl);
int qual_fcache_stats(struct qual_fcache *c, struct qual_fcache_stats *out, int reset);
/* The storage requests a gather of these rows would make now: distinct pages of the rows not in
 * the CPU buffer that the cache does not hold (GIDS's accumulator counts these). */
int qual_fcache_probe(struct qual_fcache *c, const int64_t *rows, uint64_t n, uint64_t *misses);
/* Empty the cache (every slot; pins stay): the next gather reads every page it wants. */
int qual_fcache_drop(struct qual_fcache *c);

/* ---------------------------------------------------------------- sample files (reader.c) */
/* Whole-file reads as a training data loader's read thread does them: open, read every byte
 * in block_size pieces (queue_depth in flight with io_uring, one at a time with psync) into
 * the reader's own buffers, close. The bytes are not passed on. One reader per thread. */
struct qual_reader;
struct qual_reader_opts {
    int backend;              /* enum qual_backend */
    int direct;               /* 1: O_DIRECT; 0: through the page cache */
    uint32_t align;           /* the target's logical block size */
    uint32_t block_size;      /* bytes per read, a multiple of align */
    uint32_t queue_depth;     /* reads in flight (io_uring) */
    struct qual_fault *faults; /* offsets are within each file */
    uint32_t nfaults;
};
int qual_reader_open(const struct qual_reader_opts *o, struct qual_reader **out);
int qual_reader_close(struct qual_reader *r);
int qual_reader_backend(const struct qual_reader *r, int *backend);
/* Read the whole file; *bytes is its size. ctl (shared by readers) cancels, and its bytes_done
 * and ops_done (one per file) grow as files complete. */
int qual_reader_read(struct qual_reader *r, const char *path, struct qual_ctl *ctl,
                     uint64_t *bytes);
/* A part of a file to read: for a columnar file (parquet), one column chunk of a row group. */
struct qual_range {
    uint64_t offset;
    uint64_t nbytes;
};
/* Read only these ranges of the file (sorted, not overlapping, each offset and length a
 * multiple of the alignment, the last may end past the file's end); *bytes is what the file
 * had in them. */
int qual_reader_read_ranges(struct qual_reader *r, const char *path,
                            const struct qual_range *ranges, uint32_t nranges,
                            struct qual_ctl *ctl, uint64_t *bytes);
/* ---------------------------------------------------------------- KV-cache store (kv.c) */
/* A KV-cache store's I/O: whole entries written to or read from given offsets of one store (a
 * file or a block device), each in block_size pieces with queue_depth in flight (io_uring; one
 * at a time with psync), straight from or into the caller's memory. An entry's latency runs
 * from its first piece handed over to its last piece back; a batch of writes ends with one
 * fdatasync, timed apart (sync_ns). Offsets, lengths and buffers are aligned to align. */
struct qual_kv;
struct qual_kv_opts {
    int backend;              /* enum qual_backend */
    int direct;               /* 1: O_DIRECT */
    uint32_t align;           /* the target's logical block size */
    uint32_t block_size;      /* bytes per I/O, a multiple of align */
    uint32_t queue_depth;
    uint64_t command_timeout_ns; /* an I/O outstanding this long is a stall (0: NVMe's 30 s) */
    struct qual_fault *faults; /* offsets are the store's */
    uint32_t nfaults;
    int unique;               /* 1: writes ignore the entries' buffers and move the store's own
                                 random bytes, each 4 KiB stamped with (stamp, a counter), so
                                 that no two 4 KiB blocks the store writes are alike (a drive
                                 that compresses or deduplicates stores every byte) */
    uint64_t stamp;           /* the run's stamp (unique: two stores of a run differ in it) */
};
struct qual_kv_entry {
    uint64_t offset;
    uint64_t len;
    void *buf;
    uint64_t buf_len;         /* bytes at buf (0: len); shorter than len, the buffer repeats:
                                 a piece at entry offset x moves buf + x % buf_len, so buf_len
                                 is a multiple of block_size (an entry of GiB, a buffer of MiB) */
};
struct qual_kv_result {
    uint64_t bytes;
    uint32_t entries;         /* entries moved (all, or 0 on an error) */
    uint64_t io_ns;           /* the batch's I/O, first piece to last */
    uint64_t sync_ns;         /* a write batch's fdatasync */
};
int qual_kv_open(const char *path, const struct qual_kv_opts *o, struct qual_kv **out);
int qual_kv_close(struct qual_kv *kv);
int qual_kv_backend(const struct qual_kv *kv, int *backend);
/* Move n entries (op: QUAL_OP_WRITE or QUAL_OP_READ); lat_ns[i] is entry i's latency and
 * start_ns[i] when its first piece was handed over, from the batch's start (so a request of
 * several entries spans from its first entry's start to its last entry's end). ctl cancels;
 * its bytes_done and ops_done (one per entry) grow when a batch completes. */
int qual_kv_run(struct qual_kv *kv, int op, const struct qual_kv_entry *entries, uint32_t n,
                uint64_t *lat_ns, uint64_t *start_ns, struct qual_ctl *ctl,
                struct qual_kv_result *res);

/* ---------------------------------------------------------------- data integrity (verify.c) */
/* Verification blocks: every block of block_size bytes starts with a header
 *   magic "QVB1" (u32), CRC32C of the whole block with this field zero (u32),
 *   the block's own byte offset (u64), the run's seed (u64), a sequence number (u64)
 * and is filled after it with bytes drawn from (seed, offset, sequence). A write pass lays the
 * blocks of [offset, offset + size) down with sequence `seq`, in sequential or random order
 * (every block once), and makes them durable; a read pass reads them back and classifies each:
 * good, corrupted (its bytes fail their CRC, or no header), foreign (another run's seed),
 * misdirected (a good block that names another offset), or stale (this block from an older
 * sequence: a lost write), or unreadable (the drive answered its read with a medium error —
 * EIO, ENODATA, EILSEQ, EBADMSG — or fewer bytes: a finding, and the check goes on). The
 * max_report bad blocks at the lowest offsets are described in `bad`, in offset order
 * (whatever order the reads completed in). */
enum qual_verdict_kind {
    QUAL_BLOCK_CORRUPTED = 1,
    QUAL_BLOCK_FOREIGN = 2,
    QUAL_BLOCK_MISDIRECTED = 3,
    QUAL_BLOCK_STALE = 4,
    QUAL_BLOCK_UNREADABLE = 5,
};

struct qual_verify_opts {
    int op;                   /* QUAL_OP_WRITE lays blocks down, QUAL_OP_READ checks them */
    int backend;              /* enum qual_backend */
    int direct;               /* 1: O_DIRECT */
    struct qual_inode expect; /* what the path must open (see struct qual_inode) */
    int random;               /* 1: blocks in a seeded random order, else ascending */
    uint32_t align;
    uint32_t block_size;      /* a multiple of align and of 512, at least 512 */
    uint32_t queue_depth;
    uint64_t offset;          /* a multiple of block_size */
    uint64_t size;            /* a multiple of block_size */
    uint64_t seed;
    uint64_t seq;             /* written with, or expected */
    struct qual_fault *faults;
    uint32_t nfaults;
};

struct qual_bad_block {
    uint64_t offset;          /* where it was read */
    int kind;                 /* enum qual_verdict_kind */
    uint64_t found_offset;    /* what its header says (corrupted: 0) */
    uint64_t found_seed;
    uint64_t found_seq;
    int error;                /* unreadable: the read's negative errno (short: -EIO) */
};

struct qual_verify_result {
    int backend;
    uint64_t blocks;          /* written or checked */
    uint64_t bytes;
    uint64_t elapsed_ns;      /* write: the fdatasync included */
    uint64_t corrupted, foreign, misdirected, stale, unreadable;
    uint32_t reported;        /* entries filled in bad */
};

int qual_verify_run(const char *path, const struct qual_verify_opts *o, struct qual_ctl *ctl,
                    struct qual_verify_result *res, struct qual_bad_block *bad,
                    uint32_t max_report);
/* Fill one verification block (tests use it to plant stale and misdirected blocks). */
int qual_verify_fill(void *buf, uint32_t block_size, uint64_t offset, uint64_t seed, uint64_t seq);

/* ---------------------------------------------------------------- targets (target.c) */

/* O_DIRECT alignment for path: memory and offset/length, from statx(STATX_DIOALIGN) when the
 * kernel and filesystem report it; -EOPNOTSUPP when they do not. */
int qual_dio_align(const char *path, uint32_t *mem_align, uint32_t *offset_align);

/* Which of a file's pages the page cache holds now (mincore over a mapping that touches
 * nothing): vec gets one byte per page of page_size bytes (the system's page size), bit 0 set
 * when resident; pages = ceil(file size / page_size) must match what the caller allocated. */
int qual_page_residency(const char *path, uint64_t pages, uint8_t *vec);

#endif
