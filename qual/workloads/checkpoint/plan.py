"""From a model architecture, a parallel layout and a precision recipe to every rank's tensors
(name, shape, dtype) in an LLM checkpoint, with the arithmetic that sizes it.

The parameter count follows DLIO's checkpoint model (docs/ARCHITECTURE.md §9, DLIO):
N = 2·V·h (embedding and untied lm_head) + L·[2h (norms) + h·(h + 2·kv) (QKV) + h² (output
projection) + 3·h·ffn (gated MLP)] + h (final norm), with kv = (h / heads) · kv_heads.
Tensors are split as Megatron-LM splits them: column-parallel Q, K, V, gate and up and
row-parallel output and down projections over tensor-parallel ranks, the embedding and lm_head
by vocabulary, norms replicated; layers over pipeline stages with the first L mod PP stages
holding one extra layer, stage 0 the embedding and the last stage the final norm and lm_head.

A subset plan (MLPerf Storage's subset mode, for node-local storage) is what one host of a
larger layout writes: `subset` processes, each standing for one of the layout's ranks spread
evenly over it and sized to the mean rank's share, so the host writes subset/(TP x PP x DP)
of the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# bytes per element of the dtypes a checkpoint holds
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "uint8": 1, "int64": 8}
ABSMAX_BLOCK = 2048  # 8-bit Adam keeps one fp32 scale per block of values (bitsandbytes)


@dataclass(frozen=True)
class Architecture:
    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    note: str = ""
    # bytes of bf16 weights a published sizing gives where it differs from the shape's own
    # arithmetic; every tensor is then stretched by that ratio (0: the shape's size)
    published_weights: int = 0

    @property
    def kv_dim(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    def layer_weights(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, how it is split over tensor-parallel ranks) of one layer."""
        h, kv, f = self.hidden, self.kv_dim, self.ffn
        return [
            ("input_layernorm.weight", (h,), "replicated"),
            ("self_attn.q_proj.weight", (h, h), "rows"),
            ("self_attn.k_proj.weight", (kv, h), "rows"),
            ("self_attn.v_proj.weight", (kv, h), "rows"),
            ("self_attn.o_proj.weight", (h, h), "columns"),
            ("post_attention_layernorm.weight", (h,), "replicated"),
            ("mlp.gate_proj.weight", (f, h), "rows"),
            ("mlp.up_proj.weight", (f, h), "rows"),
            ("mlp.down_proj.weight", (h, f), "columns"),
        ]

    def parameters(self) -> int:
        h, L = self.hidden, self.layers
        per_layer = 2 * h + h * (h + 2 * self.kv_dim) + h * h + 3 * h * self.ffn
        return 2 * self.vocab * h + L * per_layer + h

    @property
    def stretch(self) -> float:
        """How much larger than its shape a published sizing makes every tensor (1: none)."""
        if not self.published_weights:
            return 1.0
        return self.published_weights / (DTYPE_BYTES["bfloat16"] * self.parameters())


MODELS = {
    "llama3.1-8b": Architecture("llama3.1-8b", 32, 4096, 14336, 32, 8, 128256),
    "llama3.1-70b": Architecture("llama3.1-70b", 80, 8192, 28672, 64, 8, 128256),
    # DLIO's and MLPerf Storage's 70B config: 128 heads, so K and V are half the real size
    "llama3-70b-dlio": Architecture("llama3-70b-dlio", 80, 8192, 28672, 128, 8, 128256,
                                    note="DLIO/MLPerf llama3_70b config (128 heads)"),
    "llama3.1-405b": Architecture("llama3.1-405b", 126, 16384, 53248, 128, 8, 128256),
    # MLPerf Storage v2.0's 1T (Table 2; DLIO llama3_1t.yaml). 25872 is not a multiple of 192
    # heads: DLIO takes the head size as 25872 // 192 = 134, so K and V are 4,288 wide.
    # MLPerf sizes it at 2,571 GiB of weights and 15,426 GiB of optimizer state (mlpstorage
    # LLM_SIZE_BY_RANK), 17,997 GiB: the "18 TB" of its table. The shape gives 1.1666x fewer
    # bytes (15,426 GiB: the table's optimizer figure is DLIO's whole checkpoint), so llama3-1t
    # stretches every tensor to MLPerf's size; llama3-1t-dlio is the size DLIO writes from it.
    "llama3-1t": Architecture("llama3-1t", 128, 25872, 98304, 192, 32, 128256,
                              note="MLPerf Storage v2.0 llama3_1t shape, sized as MLPerf's "
                                   "table sizes it", published_weights=2571 * 2**30),
    "llama3-1t-dlio": Architecture("llama3-1t-dlio", 128, 25872, 98304, 192, 32, 128256,
                                   note="DLIO llama3_1t config, the size DLIO writes"),
}


@dataclass(frozen=True)
class State:
    """One optimizer tensor kept per parameter tensor: its dtype, and how many values it holds
    per parameter value (1 for a full copy; 1/2048 for 8-bit Adam's per-block scales)."""

    name: str
    dtype: str
    per_value: float = 1.0


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    weights: str  # dtype of the model weights
    states: tuple[State, ...]

    def bytes_per_param(self) -> float:
        return DTYPE_BYTES[self.weights] + sum(DTYPE_BYTES[s.dtype] * s.per_value
                                               for s in self.states)


RECIPES = {
    # Megatron/DeepSpeed mixed-precision Adam, what DLIO and MLPerf Storage model: 2 + 4 + 4 + 4
    "mixed-adam": Recipe("mixed-adam", "bf16 weights + fp32 master copy + fp32 Adam m and v "
                         "(14 B/param, as DLIO and MLPerf Storage size checkpoints)", "bfloat16",
                         (State("master", "float32"), State("exp_avg", "float32"),
                          State("exp_avg_sq", "float32"))),
    # ~4 B/param: the only standard state that gives seed 004's 1,636 GB for 405B
    # (docs/ARCHITECTURE.md §9, seed 004)
    "bf16-adam8bit": Recipe("bf16-adam8bit", "bf16 weights + 8-bit Adam m and v with an fp32 "
                            "scale per 2048 values (~4 B/param; reproduces seed 004's 1,636 GB "
                            "for LLaMA 3.1 405B)", "bfloat16",
                            (State("exp_avg", "uint8"), State("exp_avg_sq", "uint8"),
                             State("exp_avg.absmax", "float32", 1 / ABSMAX_BLOCK),
                             State("exp_avg_sq.absmax", "float32", 1 / ABSMAX_BLOCK))),
    "fp32-weights": Recipe("fp32-weights", "fp32 weights only (4 B/param)", "float32", ()),
    "bf16-weights": Recipe("bf16-weights", "bf16 weights only (2 B/param)", "bfloat16", ()),
}


# Published sizes the plans reproduce (docs/ARCHITECTURE.md §9): DLIO / MLPerf Storage ("GB"
# there being GiB) and seed 004 (decimal GB).
REFERENCES = {
    ("llama3.1-8b", "mixed-adam"): (105 * 2**30, "DLIO/MLPerf Storage llama3-8b, 105 GiB"),
    ("llama3-70b-dlio", "mixed-adam"): (911 * 2**30, "DLIO/MLPerf Storage llama3-70b, 911 GiB"),
    ("llama3.1-405b", "mixed-adam"): (5292 * 2**30, "DLIO/MLPerf Storage llama3-405b, 5,292 GiB"),
    ("llama3.1-405b", "bf16-adam8bit"): (1636e9, "seed 004, LLaMA 3.1 405B TP4 x PP2, 1,636 GB"),
    # the table's "18 TB" in its own units (its 105 GB and 5.29 TB are 105 and 5,292 GiB)
    ("llama3-1t", "mixed-adam"): (18000 * 2**30, "MLPerf Storage v2.0 Table 2, llama3-1t, "
                                                 "\"18 TB\" (18,000 GiB in its units)"),
    ("llama3-1t-dlio", "mixed-adam"): (15426 * 2**30, "DLIO's llama3_1t checkpoint, 15,426 GiB "
                                       "(mlpstorage lists it as the 1T optimizer figure)"),
}

# MLPerf Storage's subset mode: one host with this many processes (mlpstorage LLM_SUBSET_PROCS)
SUBSET_PROCESSES = 8

# The layouts MLPerf Storage v2.0 runs each model in (Table 2: TP x PP x DP, ZeRO stage; the
# product is its CLOSED process count: 8, 64, 512, 1,024).
MLPERF_LAYOUTS = {
    "llama3.1-8b": (1, 1, 8, 3),
    "llama3-70b-dlio": (8, 1, 8, 3),
    "llama3.1-405b": (8, 32, 2, 1),
    "llama3-1t": (8, 64, 2, 1),
    "llama3-1t-dlio": (8, 64, 2, 1),
}


@dataclass(frozen=True)
class Layout:
    """Tensor-parallel x pipeline-parallel x data-parallel ranks and ZeRO stage: 0 (the
    first data-parallel group writes everything), 1 (optimizer state split over data-parallel
    ranks, weights from the first group) or 3 (weights split too)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp, pp, tp) of a rank; tensor-parallel ranks are adjacent, as in Megatron-LM."""
        return rank // (self.tp * self.pp), rank // self.tp % self.pp, rank % self.tp

    def stage_layers(self, layers: int, stage: int) -> range:
        base, extra = divmod(layers, self.pp)
        start = stage * base + min(stage, extra)
        return range(start, start + base + (stage < extra))


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    group: str  # weights | optimizer | state

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class RankPlan:
    rank: int
    coords: tuple[int, int, int]
    tensors: tuple[TensorSpec, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def group_bytes(self, group: str) -> int:
        return sum(t.nbytes for t in self.tensors if t.group == group)


@dataclass(frozen=True)
class Plan:
    model: Architecture
    layout: Layout
    recipe: Recipe
    scale: float
    ranks: tuple[RankPlan, ...] = field(repr=False)
    subset: int = 0  # processes on this host in subset mode (0: every rank of the layout)
    full_bytes: int = 0  # the whole layout's checkpoint, which a subset is a share of

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.ranks)

    @property
    def tensors(self) -> int:
        return sum(len(r.tensors) for r in self.ranks)

    def keys(self) -> dict:
        """What rebuilds this plan (plan_from): a job's, a manifest's."""
        return {"model": self.model.name, "recipe": self.recipe.name, "tp": self.layout.tp,
                "pp": self.layout.pp, "dp": self.layout.dp, "zero": self.layout.zero,
                "scale": self.scale, "subset": self.subset}

    def summary(self) -> dict:
        return {**self.keys(), "ranks": self.layout.ranks, "bytes": self.nbytes,
                "full_bytes": self.full_bytes, "tensors": self.tensors,
                "parameters": self.model.parameters(), "stretch": self.model.stretch}


def plan_from(keys: dict) -> Plan:
    """The plan a job or a manifest names (a manifest from before subsets has none)."""
    return build_plan(keys["model"], Layout(keys["tp"], keys["pp"], keys["dp"], keys["zero"]),
                      keys["recipe"], keys["scale"], keys.get("subset", 0))


def _split(shape: tuple[int, ...], how: str, tp: int) -> tuple[int, ...]:
    if how == "replicated" or tp == 1:
        return shape
    axis = 0 if how == "rows" else 1
    if shape[axis] % tp:
        raise ValueError(f"dimension {shape[axis]} does not split over {tp} tensor-parallel ranks")
    return tuple(d // tp if i == axis else d for i, d in enumerate(shape))


def _stage_weights(model: Architecture, layout: Layout, stage: int, tp: int):
    """(name, shape of this tensor-parallel rank's shard) for one pipeline stage."""
    vocab = ("rows", (model.vocab, model.hidden))
    if stage == 0:
        yield "model.embed_tokens.weight", _split(vocab[1], vocab[0], tp)
    for i in layout.stage_layers(model.layers, stage):
        for name, shape, how in model.layer_weights():
            yield f"model.layers.{i}.{name}", _split(shape, how, tp)
    if stage == layout.pp - 1:
        yield "model.norm.weight", (model.hidden,)
        yield "lm_head.weight", _split(vocab[1], vocab[0], tp)


def _scaled(shape: tuple[int, ...], scale: float, parts: int = 1) -> tuple[int, ...]:
    """A shard of 1/parts of a tensor, resized by scale; a resized tensor is stored flat."""
    numel = math.prod(shape)
    if scale == 1 and parts == 1:
        return shape
    return (max(1, round(numel * scale / parts)),)


def _rank(arch: Architecture, layout: Layout, rec: Recipe, rank: int, factor: float) -> RankPlan:
    """One rank's tensors, every one resized by factor."""
    dp, stage, tp = layout.coords(rank)
    tensors = []
    writes_weights = dp == 0 or layout.zero == 3
    writes_state = dp == 0 or layout.zero in (1, 3)
    # ZeRO splits the data-parallel replicas' share evenly; without it only dp 0 writes
    w_parts = layout.dp if layout.zero == 3 else 1
    s_parts = layout.dp if layout.zero in (1, 3) else 1
    for name, shape in _stage_weights(arch, layout, stage, layout.tp):
        if writes_weights:
            tensors.append(TensorSpec(name, _scaled(shape, factor, w_parts), rec.weights,
                                      "weights"))
        if writes_state:
            for st in rec.states:
                base = shape if st.per_value == 1 else \
                    (max(1, math.ceil(math.prod(shape) * st.per_value)),)
                tensors.append(TensorSpec(f"optimizer.{st.name}.{name}",
                                          _scaled(base, factor, s_parts), st.dtype, "optimizer"))
    if writes_state and rec.states:
        tensors.append(TensorSpec("optimizer.step", (1,), "int64", "state"))
    return RankPlan(rank, (dp, stage, tp), tuple(tensors))


def build_plan(model: str | Architecture, layout: Layout, recipe: str | Recipe,
               scale: float = 1.0, subset: int = 0) -> Plan:
    """Every rank's tensors. scale < 1 shrinks every tensor by that factor (stored flat),
    keeping the rank count, the tensor count and how the bytes are spread over them. subset
    > 0: only the processes of one host in MLPerf's subset mode (see the module's doc)."""
    arch = MODELS[model] if isinstance(model, str) else model
    rec = RECIPES[recipe] if isinstance(recipe, str) else recipe
    if not 0 < scale <= 1:
        raise ValueError(f"scale {scale} is outside (0, 1]")
    if layout.pp > arch.layers:
        raise ValueError(f"{layout.pp} pipeline stages for {arch.layers} layers")
    if layout.zero not in (0, 1, 3):
        raise ValueError(f"ZeRO stage {layout.zero} is not 0, 1 or 3")
    if subset > layout.ranks:
        raise ValueError(f"a subset of {subset} processes of a {layout.ranks}-rank layout")
    factor = scale * arch.stretch
    ranks = tuple(_rank(arch, layout, rec, r, factor) for r in range(layout.ranks))
    full = sum(r.nbytes for r in ranks)
    if subset:
        # the layout's writing ranks spread evenly, each resized to the mean rank's share
        writers = [r for r in ranks if r.nbytes]
        mean = full / layout.ranks
        picked = [writers[i * len(writers) // subset] for i in range(subset)]
        ranks = tuple(_rank(arch, layout, rec, r.rank, factor * mean / r.nbytes)
                      for r in picked)
    return Plan(arch, layout, rec, scale, ranks, subset, full)


def describe(plan: Plan) -> str:
    """The derivation of a plan's size, for `qual checkpoint --plan`."""
    m, lay, rec = plan.model, plan.layout, plan.recipe
    h, L, kv, V = m.hidden, m.layers, m.kv_dim, m.vocab
    per_layer = 2 * h + h * (h + 2 * kv) + h * h + 3 * h * m.ffn
    n = m.parameters()
    lines = [
        f"model {m.name}: {L} layers, hidden {h}, FFN {m.ffn}, {m.heads} heads "
        f"({m.kv_heads} KV heads, KV width {kv}), vocabulary {V}" + (f" [{m.note}]" if m.note else ""),
        "parameters = 2*V*h + L*(2h + h*(h + 2*kv) + h^2 + 3*h*ffn) + h",
        f"           = 2*{V}*{h} + {L}*{per_layer:,} + {h} = {n:,} ({n / 1e9:.2f} B)",
    ]
    if m.stretch != 1:
        sized = n * m.stretch
        lines += [f"published sizing: {m.published_weights:,} bytes of bf16 weights "
                  f"({m.published_weights / 2**30:,.0f} GiB) = {sized:,.0f} parameters "
                  f"({sized / 1e9:,.2f} B),",
                  f"           {m.stretch:.4f}x the shape's: every tensor is stretched by that"]
        n = sized
    lines += [
        f"recipe {rec.name}: {rec.description}",
        f"           {rec.bytes_per_param():.4f} B/param x {n:,.0f} = "
        f"{n * rec.bytes_per_param() / 1e9:,.1f} GB = {n * rec.bytes_per_param() / 2**30:,.0f} GiB",
        f"layout TP{lay.tp} x PP{lay.pp} x DP{lay.dp} (ZeRO {lay.zero}): {lay.ranks} ranks"
        + (f", every tensor scaled by {plan.scale:g}" if plan.scale != 1 else ""),
    ]
    if plan.subset:
        mean = plan.full_bytes / lay.ranks
        lines += [f"subset (MLPerf, node-local storage): {plan.subset} processes on this host, "
                  f"standing for the layout's ranks {', '.join(str(r.rank) for r in plan.ranks)},",
                  f"           each sized to the mean rank's {_gb(round(mean))} = "
                  f"{plan.full_bytes:,} / {lay.ranks} bytes"]
    lines += ["", f"{'rank':>5} {'dp,pp,tp':>9} {'tensors':>8} {'weights':>12} {'optimizer':>12} "
                  f"{'total':>12}"]
    for r in plan.ranks:
        lines.append(f"{r.rank:>5} {','.join(map(str, r.coords)):>9} {len(r.tensors):>8} "
                     f"{_gb(r.group_bytes('weights')):>12} {_gb(r.group_bytes('optimizer')):>12} "
                     f"{_gb(r.nbytes):>12}")
    total = plan.full_bytes
    lines += ["", f"checkpoint: {total:,} bytes = {total / 1e9:,.2f} GB = {total / 2**30:,.2f} GiB, "
                  f"{lay.ranks} files" + ("" if plan.subset else f", {plan.tensors:,} tensors")]
    if plan.subset:
        mine = plan.nbytes
        lines.append(f"this host: {mine:,} bytes = {mine / 2**30:,.2f} GiB in {plan.subset} files, "
                     f"{mine / total:.5f} of the checkpoint ({plan.subset}/{lay.ranks} = "
                     f"{plan.subset / lay.ranks:.5f})")
    mlperf = MLPERF_LAYOUTS.get(m.name)
    if mlperf:
        tp, pp, dp, zero = mlperf
        lines.append(f"MLPerf Storage v2.0 runs {m.name} as TP{tp} x PP{pp} x DP{dp}, ZeRO {zero}: "
                     f"{tp * pp * dp:,} processes")
    reference = REFERENCES.get((m.name, rec.name))
    if reference and plan.scale == 1:
        ref, label = reference
        lines.append(f"reference: {label}; this plan is {(total / ref - 1) * 100:+.2f} % of it")
    return "\n".join(lines)


def _gb(n: int) -> str:
    return f"{n / 1e9:,.3f} GB"
