"""The Pythonic face of the native engine (docs/ARCHITECTURE.md §1): jobs, histograms,
checkpoint files, the feature cache, sample readers, verification blocks and the KV-cache
store, one module each,
over one private binding (_binding.py) that alone imports the cffi library. Errors come from
qual.errors."""

from qual.engine._binding import (BACKENDS, MAX_BLOCK_SIZE, MAX_QUEUE_DEPTH, MAX_WORKERS, OPS,
                                  PATTERNS, STOP_WAIT, UNBOUNDED, Progress, new_ctl)
from qual.engine.cache import CacheStats, FeatureCache, sample
from qual.engine.checkpoint import (FileResult, chunk_count, read_checkpoint_file,
                                    write_checkpoint_file)
from qual.engine.data import (aligned_empty, crc32c, crc32c_hardware, dio_alignment, fill_random,
                              io_uring_status, page_residency, pattern_check,
                              pattern_fill)
from qual.engine.histogram import PERCENTILES, LatencyHistogram, bucket_index, bucket_value
from qual.engine.job import PATTERN_UNIT, Direction, Fault, IoJob, IoResult, combined, run_job
from qual.engine.kvstore import KvBatch, KvStore
from qual.engine.reader import Ranges, SampleReader
from qual.engine.verify import BLOCK_KINDS, BadBlock, VerifyResult, verify_block, verify_blocks
from qual.errors import (BackendUnavailable, Cancelled, DataMismatch, DeviceIoError,
                         EngineStuck, InvalidJob, NoSpace, QualError, Stalled, TargetUnavailable,
                         error_for)

__all__ = [
    "BACKENDS", "BLOCK_KINDS", "MAX_BLOCK_SIZE", "MAX_QUEUE_DEPTH", "MAX_WORKERS", "OPS",
    "PATTERNS", "PATTERN_UNIT", "PERCENTILES", "STOP_WAIT", "UNBOUNDED", "BackendUnavailable",
    "BadBlock", "CacheStats", "Direction", "combined", "aligned_empty", "Cancelled", "DataMismatch", "DeviceIoError", "EngineStuck",
    "Fault", "FeatureCache", "FileResult", "InvalidJob", "IoJob", "IoResult", "KvBatch", "KvStore",
    "LatencyHistogram",
    "NoSpace", "Progress", "QualError", "Ranges", "SampleReader", "Stalled", "TargetUnavailable",
    "VerifyResult", "bucket_index", "bucket_value", "chunk_count", "crc32c", "crc32c_hardware",
    "dio_alignment", "error_for", "fill_random", "io_uring_status", "new_ctl", "page_residency",
    "pattern_check",
    "pattern_fill", "read_checkpoint_file", "run_job", "sample", "verify_block", "verify_blocks",
    "write_checkpoint_file",
]
