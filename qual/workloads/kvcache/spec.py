"""The KV-cache family's spec (MLPerf Storage v3.0's KV-cache benchmark; docs/ARCHITECTURE.md
§9, MLPerf Storage v3.0): the models whose attention keys and values are offloaded, the bytes one token's KV
entry takes, the users' QoS classes, the fields of the profile table and the metrics."""

from __future__ import annotations

from dataclasses import dataclass

from qual.family import Field
from qual.measurement import Metric, Param, measurement_id
from qual.workloads.base import backend_field

NAME = "kvcache"
REFERENCE = "mlcommons/storage kv_cache_benchmark/kv_cache/models.py at 64f05b37"


@dataclass(frozen=True)
class Model:
    """What one token's KV entry holds. MHA/GQA: every layer keeps a key and a value of head_dim
    elements per KV head; MLA (DeepSeek) keeps one compressed latent of `latent` elements plus a
    shared RoPE key of `rope` elements per layer, keys and values together (no x 2)."""

    name: str
    layers: int
    kv_heads: int = 0
    head_dim: int = 0
    latent: int = 0   # MLA: kv_lora_rank
    rope: int = 0     # MLA: qk_rope_head_dim
    bytes_per_element: int = 2  # fp16 / bf16

    @property
    def bytes_per_token(self) -> int:
        if self.latent:
            return self.layers * (self.latent + self.rope) * self.bytes_per_element
        return self.layers * self.kv_heads * self.head_dim * 2 * self.bytes_per_element

    def derivation(self) -> str:
        """The arithmetic, as `--plan` prints it."""
        if self.latent:
            return (f"{self.name} (MLA): layers x (latent rank + RoPE dim) x bytes = {self.layers} "
                    f"x ({self.latent} + {self.rope}) x {self.bytes_per_element} = "
                    f"{self.bytes_per_token:,} B/token")
        return (f"{self.name}: layers x KV heads x head dim x 2 (K and V) x bytes = {self.layers} "
                f"x {self.kv_heads} x {self.head_dim} x 2 x {self.bytes_per_element} = "
                f"{self.bytes_per_token:,} B/token")


# the reference's model table (fp16); head dim = hidden / heads unless the model gives its own
MODELS = {m.name: m for m in (
    Model("llama3.1-8b", layers=32, kv_heads=8, head_dim=4096 // 32),
    Model("llama3.1-70b", layers=80, kv_heads=8, head_dim=8192 // 64),
    Model("mistral-7b", layers=32, kv_heads=8, head_dim=4096 // 32),
    Model("llama2-7b", layers=32, kv_heads=32, head_dim=4096 // 32),
    Model("deepseek-v3", layers=61, latent=512, rope=64),
    Model("qwen3-32b", layers=64, kv_heads=8, head_dim=128),
    Model("gpt-oss-120b", layers=36, kv_heads=8, head_dim=64),
    Model("gpt-oss-20b", layers=24, kv_heads=8, head_dim=64),
)}

# the reference's QoS classes: end-to-end latency targets (seconds) at p95 and p99
QOS = {"interactive": (0.050, 0.100), "responsive": (0.100, 0.200), "batch": (1.0, 5.0)}
MODES = ("fixed", "qos", "capacity")

# MLPerf Storage v3.0's closed KV-cache options (its Rules §6.3.1, Table KVCache-1): each
# client's fixed workload; generation-mode none (no simulated token time) as qual always runs.
# The release's option 3 names llama3.1-70b-instruct, whose KV entry is llama3.1-70b's.
OPTIONS = {
    1: {"name": "Max Storage Stress", "model": "llama3.1-8b", "users": 200, "cpu_mem": 0,
        "gpu_mem": 0, "allocations": 16},
    2: {"name": "Storage Throughput", "model": "llama3.1-8b", "users": 100,
        "cpu_mem": 4 << 30, "gpu_mem": 0, "allocations": 16},
    3: {"name": "Large Model (70B)", "model": "llama3.1-70b", "users": 70, "cpu_mem": 0,
        "gpu_mem": 0, "allocations": 4},
}
CLOSED = {"duration": 300.0, "trials": 3, "seed": 42}  # its Rules §6.3.2.1: the sequence locks
LOCKED = ("model", "users", "cpu_mem", "gpu_mem", "allocations", "trials", "mode", "draw")

# The reference's own draw of its users and their requests (kv_cache/workload.py's
# UserSimulator, kv_cache/benchmark.py's generate_requests and process_requests at 23aa82e):
# a user is one of three templates, picked alike, with a QoS class drawn 15 / 35 / 50 %; it
# keeps a context length, a generation length and a think time drawn once from its template.
TEMPLATES = {  # (context tokens, generated tokens, think time in seconds): lowest, highest
    "chatbot": ((512, 4096), (50, 200), (0.1, 0.5)),
    "coding": ((4096, 25000), (100, 500), (0.2, 1.0)),
    "document": ((4096, 16384), (200, 800), (0.3, 1.5)),
}
QOS_SHARES = {"interactive": 0.15, "responsive": 0.35, "batch": 0.50}
# Before each request a user pauses its think time x U(0.8, 1.2). A request's context is drawn
# from a quarter of the user's up to all of it and written as a whole new entry; its generated
# tokens the same way. A conversation goes on to another turn with probability CONTINUE, for
# MAX_TURNS at most; a later turn first reads back every earlier turn's entry still stored.
CONTINUE, MAX_TURNS = 0.8, 50
PREFILL_ONLY = 10_000  # a context of this many tokens or more is prefilled only, not decoded
DECODE_BATCH = 32      # decode reads the new entry once, then once per this many tokens
# prefix caching (on by default): a fifth of requests open with one of three system prompts
# (5, 9 and 6 words), whose tokens leave the request's own entry; the prompt's entry is never
# written, so reading it moves nothing
SYSTEM_PROMPT_SHARE, SYSTEM_PROMPT_TOKENS = 0.2, (5, 9, 6)
DRAWS = ("qual", "reference")
FREE_SHARE = 0.95  # the reference's drive tier: this share of the room free on its folder
OVERWRITTEN_SAID = 0.10  # a run whose decode found more of its entries overwritten says so
TEMPLATE_DEFAULTS = {k: v for name, (ctx, gen, think) in TEMPLATES.items() for k, v in (
    (f"{name}_context", list(ctx)), (f"{name}_generation", list(gen)),
    (f"{name}_think_min", think[0]), (f"{name}_think_max", think[1]))}
_PCT, _OP, _CLASS, _TIER = (Param("pct", "percentile"), Param("op", "name"), Param("class", "name"),
                            Param("tier", "name"))
PERCENTILES = (50.0, 95.0, 99.0)

METRICS = {m.name: m for m in (
    Metric("kv_storage_lat", "time", "lower", (_OP, _PCT),
           "a request's KV entries written to (prefill) or read from (decode) the drive, "
           "first byte handed over to last back, a write batch's fdatasync included"),
    Metric("kv_e2e_lat", "time", "lower", (_CLASS, _PCT),
           "a request's end-to-end latency, arrival to its last decode read, by QoS class"),
    Metric("kv_queue_wait", "time", "lower", (_PCT,), "a request's wait before it is served"),
    Metric("kv_tokens_per_s", "tokens", "higher", (),
           "MLPerf's avg_throughput_tokens_per_sec: tokens generated over the run's duration"),
    Metric("kv_storage_tokens_per_s", "tokens", "higher", (),
           "MLPerf's storage_throughput_tokens_per_sec: tokens generated over the sum of every "
           "request's storage I/O time (its entries' write and read; requests served together "
           "each counted)"),
    Metric("kv_drive_busy_tokens_per_s", "tokens", "higher", (),
           "qual's own: tokens generated per second the drive was busy (the batches' I/O "
           "time, requests served together counted once)"),
    Metric("kv_tier_bw", "bandwidth", "higher", (_OP,),
           "MLPerf's tier_storage_read_bandwidth / tier_storage_write_bandwidth: the drive "
           "tier's bytes over the run's duration"),
    Metric("kv_overwritten_reads", "ratio", "lower", (),
           "decode reads that found their entry overwritten by the ring (nothing read), of all "
           "decode reads"),
    Metric("kv_requests_served", "count", "higher", (_CLASS,),
           "requests served, by QoS class"),
    Metric("kv_decode_bytes_read", "size", "higher", (),
           "bytes decode read back from the drive, proven by its counters"),
    Metric("kv_hit_rate", "ratio", "higher", (_TIER,),
           "decode reads a tier served, of all decode reads"),
    Metric("kv_max_users", "count", "higher", (),
           "qos mode: the most users whose run held every class's p95 and p99 targets (the "
           "search's next step did not)"),
    Metric("kv_peak_users", "count", "higher", (),
           "capacity mode: the users at the peak storage throughput"),
    Metric("kv_aggregate_read_bw", "bandwidth", "higher", (),
           "MLPerf's aggregate storage read bandwidth: each client's drive-tier bytes read over "
           "the run's duration, summed over clients, the mean over trials (Rules §6.3.4.1)"),
    Metric("kv_aggregate_write_bw", "bandwidth", "higher", (),
           "the same of the drive-tier bytes written"),
    Metric("kv_aggregate_avg_tokens_per_s", "tokens", "higher", (),
           "MLPerf's aggregate average throughput: each client's tokens over its run's "
           "duration, summed over clients, the mean over trials"),
    Metric("kv_aggregate_storage_tokens_per_s", "tokens", "higher", (),
           "MLPerf's aggregate storage throughput: each client's storage_throughput_tokens_per_"
           "sec (tokens over the sum of its requests' storage I/O times), summed over clients, "
           "the mean over trials (Rules §6.3.4.2)"),
    Metric("kv_worst_client_read_p95", "time", "lower", (),
           "MLPerf's aggregate device read p95: the worst client's p95 of one entry's read, "
           "over all clients and trials, not a pooled percentile (Rules §6.3.4.3)"),
    Metric("kv_worst_client_write_p95", "time", "lower", (),
           "the same of one entry's write, its fdatasync included"),
)}
AGGREGATE = ("kv_aggregate_read_bw", "kv_aggregate_write_bw", "kv_aggregate_avg_tokens_per_s",
             "kv_aggregate_storage_tokens_per_s", "kv_worst_client_read_p95",
             "kv_worst_client_write_p95")

FIELDS = (
    Field("model", "choice", default="llama3.1-8b", choices=tuple(MODELS),
          help="the served model: bytes of KV cache per token"),
    Field("mode", "choice", default="fixed", choices=MODES,
          help="fixed: `users` users; qos: the most users whose every class holds its targets, "
               "searched from `users` up to `max_users` in steps of `search_step`; capacity: "
               "the users at the peak storage throughput, doubling from `users`"),
    Field("users", "count", default=8, maximum=4096,
          help="concurrent users (qos and capacity: where the search starts)"),
    Field("max_users", "count", default=1024, maximum=4096,
          help="qos and capacity: the most users a search tries"),
    Field("search_step", "count", default=1, maximum=4096,
          help="qos: the search's resolution: the answer holds its targets, this many more "
               "users did not"),
    Field("duration", "duration", default="0 s", minimum=0,
          help="how long users keep talking, each starting a new conversation when one ends "
               "(0: each user's `requests` turns, once)"),
    Field("requests", "count", default=4, help="requests per user (turns of its conversation)"),
    Field("context_tokens", "counts", default=[256, 1024],
          help="the first turn's context, drawn between the two (lowest, highest)"),
    Field("turn_tokens", "count", default=128, help="tokens a later turn adds to its context"),
    Field("generation_tokens", "count", default=64, help="tokens generated per request"),
    Field("prefixes", "count", default=0, minimum=0, maximum=4096,
          help="shared prefixes (system prompts) conversations begin with, user u's the "
               "(u mod prefixes)th: its KV entry is written once, by its first user, and read "
               "by every decode of every conversation that shares it (0: none)"),
    Field("prefix_tokens", "count", default=512, help="tokens of a shared prefix"),
    Field("think_time", "duration", default="0 s", minimum=0,
          help="a user's pause between its requests"),
    Field("draw", "choice", default="qual", choices=DRAWS,
          help="qual: users and requests as requests, context_tokens, turn_tokens, "
               "generation_tokens, think_time and classes say (each entry on the drive for "
               "the run); reference: as MLPerf's kv_cache_benchmark draws them (`templates`, "
               "QoS 15/35/50 %, conversations going on with p 0.8 up to 50 turns, decode "
               "re-reading once per 32 tokens), its drive tier a ring of store_size that "
               "evicts the oldest entries (an MLPerf option: reference)"),
    Field("templates", "table", fields=tuple(
        f for name, (ctx, gen, think) in TEMPLATES.items() for f in (
            Field(f"{name}_context", "counts", default=list(ctx),
                  help=f"a {name} user's context length: drawn between the two"),
            Field(f"{name}_generation", "counts", default=list(gen),
                  help=f"a {name} user's generation length: drawn between the two"),
            Field(f"{name}_think_min", "duration", default=f"{think[0] * 1000:g} ms",
                  help=f"a {name} user's think time: drawn from here"),
            Field(f"{name}_think_max", "duration", default=f"{think[1] * 1000:g} ms",
                  help=f"a {name} user's think time: drawn up to here"))), default={},
          help="draw reference: the three user templates (the reference's by default)"),
    Field("classes", "choices", default=list(QOS), choices=tuple(QOS),
          help="the QoS classes users are drawn from, in turn"),
    Field("qos", "table", fields=tuple(
        Field(f"{c}_p{p}", "duration", default=f"{t * 1000:g} ms",
              help=f"the {c} class's end-to-end latency target at p{p}")
        for c, targets in QOS.items() for p, t in zip((95, 99), targets)), default={},
          help="each class's end-to-end latency targets (the reference's by default)"),
    Field("cpu_mem", "size", default=0, minimum=0,
          help="the CPU tier: KV entries kept in host memory (LRU, evicting to the drive)"),
    Field("gpu_mem", "size", default=0, minimum=0,
          help="the GPU tier (needs CUDA; 0 where there is none)"),
    Field("store_size", "size", default=0, minimum=0,
          help="the store qual lays out on the target for the drive tier (0: draw qual, what "
               "the run needs at most, every entry on the drive; draw reference, 95 % of the "
               "room free on the target, as the reference)"),
    Field("accept_misses", "bool", default=False,
          help="draw reference: run even where the store cannot hold one entry of every user "
               "at once (most decode reads would find their entry overwritten), with a CAVEAT; "
               "without it such a run is refused before any I/O"),
    Field("allocations", "count", default=0, minimum=0, maximum=4096,
          help="entries a round's prefill writes at once, at most (the reference's "
               "max-concurrent-allocs; 0: every entry of the round)"),
    Field("mlperf_option", "count", default=0, minimum=0, maximum=len(OPTIONS),
          help="run MLPerf Storage v3.0's closed option 1, 2 or 3 (its Rules §6.3.1): its "
               "model, users per client, memory tiers and concurrent allocations, 300 s, 3 "
               "trials, seed 42, scored as the release scores it; 0: none"),
    Field("clients", "count", default=1, maximum=256,
          help="client processes (the release's MPI ranks), each its own users and store, "
               "all at once on the target"),
    Field("trials", "count", default=1, maximum=100,
          help="runs of all the clients, one after the other (an option: 3)"),
    Field("block_size", "size", default="1 MiB", minimum=4096, help="bytes per I/O"),
    Field("queue_depth", "count", default=16, maximum=1024, help="I/Os in flight"),
    backend_field(),
)


def check_table(table: dict) -> list[tuple[str, str]]:
    problems = []
    option = OPTIONS.get(table["mlperf_option"])
    if option:
        locked = {**option, "trials": CLOSED["trials"], "mode": "fixed", "draw": "reference"}
        for key in LOCKED:
            if table[key] != locked[key]:
                problems.append((key, f"option {table['mlperf_option']} fixes {key} at "
                                 f"{locked[key]!r} (MLPerf Storage v3.0 Rules §6.3.1-6.3.2): "
                                 "the run would not be the option"))
    elif table["clients"] > 1 and table["mode"] != "fixed":
        problems.append(("clients", "several clients run a fixed user count, not a search"))
    lo_hi = table["context_tokens"]
    if len(lo_hi) != 2 or lo_hi[0] > lo_hi[1]:
        problems.append(("context_tokens", "needs two counts, the lowest first"))
    if table["block_size"] % 4096:
        problems.append(("block_size", "is not a multiple of 4 KiB"))
    most = table["max_users"]
    if table["mode"] != "fixed" and table["users"] > most:
        problems.append(("users", f"a search starts at {table['users']} users, above max_users "
                         f"{most}"))
    if table["mode"] == "qos" and table["search_step"] > most:
        problems.append(("search_step", f"{table['search_step']} is above max_users {most}"))
    if table["draw"] == "reference":
        problems += _check_reference(table)
    elif not problems and table["store_size"]:
        need = drive_bytes(table, most if table["mode"] != "fixed" else None)
        if need > table["store_size"]:
            problems.append(("store_size", f"{table['store_size']:,} B cannot hold the run's KV "
                             f"entries ({need:,} B at most, every entry on the drive): raise "
                             "it, or lower users, requests or context_tokens"))
    return problems


def _check_reference(table: dict) -> list[tuple[str, str]]:
    """The reference draw: its templates' ranges, a duration (its users talk until the run
    ends), no shared prefixes of qual's (it has its own system prompts), and a store that
    holds its largest entry."""
    problems = []
    for name, ranges in templates(table).items():
        for what, (lo, hi) in zip(("context", "generation", "think"), ranges):
            key = f"templates.{name}_{what}"
            if what != "think" and len(table["templates"][f"{name}_{what}"]) != 2:
                problems.append((key, "needs two counts, the lowest first"))
            elif lo > hi or (what != "think" and lo < 1):
                problems.append((key, f"{lo:g} to {hi:g} is not a range from low to high"))
    if not table["duration"]:
        problems.append(("duration", "draw reference serves for a duration, as its users talk "
                         "until the run ends: give one"))
    if table["prefixes"]:
        problems.append(("prefixes", "draw reference has its own system prompts: prefixes "
                         "must be 0"))
    need = largest_entry(table)
    if not problems and table["store_size"] and need > table["store_size"]:
        problems.append(("store_size", f"{table['store_size']:,} B cannot hold the draw's "
                         f"largest entry ({need:,} B): raise it, or lower the templates' "
                         "context"))
    return problems


def templates(table: dict) -> dict[str, tuple[tuple, tuple, tuple]]:
    """Each user template's (context, generation, think time) ranges, as the table sets them."""
    t = table["templates"]
    out = {}
    for name in TEMPLATES:
        ctx, gen = t[f"{name}_context"], t[f"{name}_generation"]
        out[name] = ((ctx[0], ctx[-1]), (gen[0], gen[-1]),
                     (t[f"{name}_think_min"], t[f"{name}_think_max"]))
    return out


def largest_entry(table: dict) -> int:
    """The reference draw's largest KV entry: its largest context, whole."""
    most = max(ctx[1] for ctx, _, _ in templates(table).values())
    return entry_bytes(most, MODELS[table["model"]].bytes_per_token)


ALIGN = 4096  # an entry on the drive takes whole units of this (O_DIRECT)


def entry_bytes(tokens: int, bytes_per_token: int) -> int:
    """A KV entry's bytes on the drive: whole 4 KiB units."""
    return -(-tokens * bytes_per_token // ALIGN) * ALIGN


def targets(table: dict) -> dict[str, tuple[float, float]]:
    """Each class's (p95, p99) end-to-end latency targets, seconds, as the table sets them."""
    q = table["qos"]
    return {c: (q[f"{c}_p95"], q[f"{c}_p99"]) for c in table["classes"]}


def turn_entries(table: dict) -> tuple[int, int]:
    """The bytes of a conversation's largest first-turn entry and of each later turn's."""
    bpt = MODELS[table["model"]].bytes_per_token
    return (entry_bytes(table["context_tokens"][1], bpt),
            entry_bytes(table["turn_tokens"] + table["generation_tokens"], bpt))


def conversation_bytes(table: dict) -> int:
    """The drive room one user's conversation takes at most: its region of the store."""
    first, later = turn_entries(table)
    return first + (table["requests"] - 1) * later


def prefix_bytes(table: dict) -> int:
    """The bytes of a shared prefix's entry (0 without shared prefixes)."""
    if not table["prefixes"]:
        return 0
    return entry_bytes(table["prefix_tokens"], MODELS[table["model"]].bytes_per_token)


def drive_bytes(table: dict, users: int | None = None) -> int:
    """The most the drive tier holds at once: the shared prefixes' entries and every entry of
    every user's conversation, as where memory holds none (a conversation that ends gives its
    room to the next). The reference draw: its ring's store_size (0: what the target has free,
    known only when the run begins)."""
    if table["draw"] == "reference":
        return table["store_size"]
    return table["prefixes"] * prefix_bytes(table) + \
        (users or table["users"]) * conversation_bytes(table)


def option_table(given: dict) -> dict:
    """A quick run's table where --mlperf-option is given: the option's locked values (the
    command fills them; a profile spells them out)."""
    option = OPTIONS.get(int(given.get("mlperf_option") or 0))
    if not option:
        return {}
    return {**{k: v for k, v in option.items() if k != "name"}, "trials": CLOSED["trials"],
            "duration": f"{CLOSED['duration']:g} s", "draw": "reference"}


def cells(table: dict) -> list[str]:
    if table["mlperf_option"] or table["clients"] > 1 or table["trials"] > 1:
        return list(AGGREGATE)
    out = [measurement_id(METRICS["kv_storage_lat"], {"op": op, "pct": p})
           for op in ("write", "read") for p in PERCENTILES]
    out += [measurement_id(METRICS["kv_e2e_lat"], {"class": c, "pct": p})
            for c in table["classes"] for p in PERCENTILES[1:]]
    out += ["kv_tokens_per_s", "kv_storage_tokens_per_s", "kv_decode_bytes_read"]
    out += [measurement_id(METRICS["kv_tier_bw"], {"op": op}) for op in ("read", "write")]
    return out + {"qos": ["kv_max_users"], "capacity": ["kv_peak_users"]}.get(table["mode"], [])
