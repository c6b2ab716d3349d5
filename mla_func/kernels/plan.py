"""One plan decides which kernel runs: `plan_step(config, device, static shape, options)`.

Every kernel choice of a step is a field of one frozen `StepPlan`, built by one pure function
from the model's config, the device's properties, the step's static shape (its token and
sequence counts: a capture bucket, or an eager step's own), the weights' precision (float or
block FP8) and the caller's `KernelOptions`:
- the options (what a caller chooses; `default_options` by device): the attention backend,
  fused Triton kernels or the torch reference for the rest, the experts' implementation,
  eager calls straight to the op's function or through torch's dispatcher, and the launch
  variants that stay selectable (the router's early launch and few-row form, the MoE sum's
  early trigger);
- the weights: float, or block FP8 (`weights`), whose projections the fused path computes in
  FP8 (`StepPlan.projections`, and each one's launch: `linear.fp8_tiles`);
- from the shape: the few-row projections (`proj_norm`, `small_linear`, `norm_linear`), the
  router's launch (`router.plan.launch_config`, or one program an expert at a few rows), the
  MoE's tiles and path (`moe.config.pick_config`) and whether its GEMMs run in block FP8
  (`experts_precision`), the attention's form (absorbed, or the MHA form for long prompts)
  and the decode's launch plan (`attention.decode_plan.plan_decode`);
- from the state: the cache's precision (`StepPlan.cache`: floats, or FP8 rows, which only
  the Triton split-KV decode reads: the plan says `fp8` and never `ws`).
The kernels take the same decisions from the same functions (`plan_rules`: the device's
spec, the shape predicates and their constants, re-exported here; each op knows its own shapes
at run time, while a traced step serves every bucket); the capture compiler's glue records
`StepPlan.summary()` per bucket in plan.json. The constants are explained in
docs/DECISIONS.md.
"""

from dataclasses import asdict, dataclass

import torch

from mla_func.cache_fp8 import check_kv_dtype
from mla_func.config import MLAConfig
from mla_func.dims import static_sizes
from mla_func.kernels.attention.decode_plan import DecodePlan, plan_decode
from mla_func.kernels.linear.fp8_tiles import fp8_tiles
from mla_func.kernels.moe.config import MoEConfig, fold_shared, pick_config
from mla_func.kernels.plan_rules import (
    EXPERTS_IMPLS,
    KERNEL_DTYPES,
    MHA_MIN_QUERY,
    NORM_LINEAR_MAX_WIDTH,
    ONE_SHOT_MAX_BYTES,
    ONE_SHOT_MAX_SENT,
    PROJ_NORM_MAX_ROWS,
    PROJ_NORM_MAX_WIDTH,
    ROUTER_MAX_EXPERTS,
    ROUTER_ROWS_MAX,
    SMALL_LINEAR_MAX_ROWS,
    WEIGHTS,
    DeviceSpec,
    all_reduce_form,
    attention_form,
    device_spec,
    experts_precision,
    fp8_gemm_runs,
    norm_linear_normalises,
    one_shot_max_bytes,
    proj_norm_rows,
    reduce_norm_fused,
    router_rows,
    small_linear_rows,
)
from mla_func.kernels.router.plan import LaunchConfig, launch_config
from mla_func.ops.moe import local_experts


@dataclass(frozen=True)
class KernelOptions:
    """What the caller chooses (the rest of a `StepPlan` follows from shapes).

    `attention`: the attention backend ("torch" or "triton"). `fused`: Triton kernels for the
    norms, the router, the experts' sum and the few-row projections (else the torch reference
    ops). `experts`: "triton", "sorted_torch" or "reference". `eager_direct`: an eager call of
    a custom op runs its function directly instead of through torch's dispatcher (the same
    kernels; the dispatcher costs host time). `router_early`: on sm90 the router launches
    while the kernel before it ends, its rows loaded before it waits (`router_preload`).
    `router_few_rows`: up to ROUTER_ROWS_MAX rows the router runs one program an expert.
    `moe_trigger`: the MoE's last programs let the next projection start (PDL).
    `mha_min_query`: a step holding a sequence of this many new tokens runs its prompts in
    the MHA form. `one_shot`: on several GPUs, sums of up to `one_shot_max_bytes(ranks)`
    (ONE_SHOT_MAX_BYTES, at most ONE_SHOT_MAX_SENT sent by each rank) run as one pushed launch
    over symmetric memory (`all_reduce_form`, `kernels.collective.push_sum`), else NCCL's.
    `reduce_norm`: with `fused`, such a one-shot sum that ends a sub-layer also adds the
    residual and takes the next norm in its launch (`reduce_norm_fused`)."""

    attention: str = "torch"
    fused: bool = False
    experts: str = "sorted_torch"
    eager_direct: bool = True
    router_early: bool = True
    router_preload: bool = True
    router_few_rows: bool = True
    moe_trigger: bool = True
    mha_min_query: int = MHA_MIN_QUERY
    one_shot: bool = True
    reduce_norm: bool = True

    def __post_init__(self) -> None:
        if self.experts not in EXPERTS_IMPLS:
            raise ValueError(f"unknown experts implementation {self.experts!r}; expected one "
                             f"of {EXPERTS_IMPLS}")
        if self.experts == "triton" and not self.fused:
            raise ValueError("experts='triton' needs fused=True (its op adds the residual and "
                             "normalises with the fused kernels' numerics)")


def default_options(device: torch.device | str, attention: str = "torch",
                    dtype: torch.dtype | None = None) -> KernelOptions:
    """The options a device runs by default: the fused kernels on CUDA, and on `meta` (so
    that planning and shape checks there see the ops a GPU runs); the torch reference
    elsewhere. `attention` "auto": the fastest backend the device runs ("triton" on CUDA,
    "torch" elsewhere). `dtype`, the weights' where the caller knows it: on CUDA, weights in
    another dtype than KERNEL_DTYPES (float32) run the torch reference ops, and "auto" is the
    torch backend (the kernels' tiles are sized for bf16/fp16)."""
    device = torch.device(device)
    half = dtype is None or dtype in KERNEL_DTYPES
    if attention == "auto":
        attention = "triton" if device.type == "cuda" and half else "torch"
    fused = device.type == "meta" or (device.type == "cuda" and half)
    return KernelOptions(attention=attention, fused=fused,
                         experts="triton" if fused else "sorted_torch")


def options_for(device: torch.device | str, kernels: KernelOptions | None, backend: str,
                unset: str = "torch", error: type[ValueError] = ValueError,
                dtype: torch.dtype | None = None) -> KernelOptions:
    """The options a call runs with: `kernels`, or the device's defaults for weights in
    `dtype` with the attention `backend`. Both given, `backend` must be `kernels.attention`
    or the caller's default (`unset`: not chosen); otherwise `error` says which."""
    if kernels is None:
        return default_options(device, backend, dtype)
    if backend not in (unset, kernels.attention):
        raise error(f"backend={backend!r} disagrees with kernels.attention="
                    f"{kernels.attention!r}: pass one of them")
    return kernels


@dataclass(frozen=True)
class StepPlan:
    """Every kernel choice of a step of `tokens` tokens over `seqs` sequences."""

    tokens: int
    seqs: int
    options: KernelOptions
    device: DeviceSpec
    # "norm_linear" | "small_linear" | "gemm"; FP8: "fp8", or "norm+fp8" (its norm apart)
    qkv_a: str
    o_proj: str  # "proj_norm" | "gemm" | "fp8+add_norm"
    router: str  # "rows" | "split" | "torch"
    router_launch: LaunchConfig | None
    experts: str
    moe: MoEConfig | None
    shared_experts: str  # "folded" | "apart" | "none"
    moe_norm_deferred: bool  # the MoE leaves its norm to the next layer's first projection
    # "absorbed" | "mha" | "absorbed+mha" (decodes and prompts) | "per step" (host metadata)
    attention_form: str
    decode: DecodePlan | None  # pure decode steps on the triton backend
    # Tensor parallel over `ranks` (1: one device): each sub-layer's partial sums meet in an
    # all-reduce before the residual add, so o_proj and the MoE leave their norms to it.
    ranks: int = 1
    all_reduce: str = "none"  # "one_shot" | "nccl" (ranks > 1)
    reduce_norm: bool = False  # the sum, the residual add and the norm in one launch
    # What the projections compute in: "fp8" (block-FP8 weights on the fused path, on a device
    # with e4m3 MMA), else the float dtype's name ("bfloat16": FP8 weights dequantised).
    projections: str = "bfloat16"
    # FP8: each projection's GEMM launch, (name, `fp8_tiles` label) pairs.
    fp8_gemms: tuple[tuple[str, str], ...] = ()
    # The latent cache's precision: "fp8" (`cache_fp8`'s rows) or the float dtype's name.
    cache: str = "bfloat16"
    # The experts' GEMMs (`experts_precision`): "fp8" | "dequantised" | a dtype | "none"
    experts_precision: str = "none"

    def summary(self, options: bool = True) -> dict:
        """The plan as plain JSON values, one line a choice (plan.json); `options` False
        leaves them out (a table of buckets states them once)."""
        out = asdict(self)
        if not options:
            del out["options"]
        major, minor = self.device.capability
        out["device"] = f"{self.device.type} ({self.device.sms} SMs, sm{major}{minor})"
        for name in ("router_launch", "moe", "decode"):
            value = getattr(self, name)
            out[name] = None if value is None else _label(value)
        if self.fp8_gemms:
            out["fp8_gemms"] = dict(self.fp8_gemms)
        else:  # float projections: nothing to say
            del out["fp8_gemms"]
        return out


def _label(choice: object) -> str:
    """A frozen dataclass of launch choices in one line: its numbers, then the flags set."""
    values = asdict(choice)
    parts = [f"{k}={v}" for k, v in values.items() if not isinstance(v, bool)]
    parts += [k for k, v in values.items() if v is True]
    return " ".join(str(p).replace(" ", "") for p in parts)


def plan_step(cfg: MLAConfig, device: DeviceSpec, tokens: int, seqs: int, *,
              options: KernelOptions, max_pages: int, page_size: int,
              dtype: torch.dtype = torch.bfloat16, max_query_len: int | None = 1,
              ranks: int = 1, weights: str = "bf16", kv_dtype: str = "auto") -> StepPlan:
    """The kernels a step of `tokens` tokens over `seqs` sequences runs (page tables
    `max_pages` wide, pages of `page_size`, weights in `dtype`, the projections' in block
    FP8 where `weights` is "fp8", the cache in `kv_dtype`: "fp8", or "auto" for floats in
    `dtype`) on one rank of `ranks`
    (its heads, its routed experts and its slice of the shared MLP, whose width decides
    whether it folds into the routed launches; the router stays whole). `max_query_len`: the
    most new tokens of one sequence, 1 for a decode step; None where each step's own decides
    (a piecewise bucket: the attention runs between the graphs, from host metadata).
    `weights`: "bf16" (float weights, in `dtype`) or "fp8" (block FP8: the projections' FP8
    GEMMs, and the Triton experts' from the FP8 rows of the tile table,
    `experts_precision`)."""
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; expected one of {WEIGHTS}")
    fused, rows = options.fused, tokens
    fp8 = fused and weights == "fp8" and device.fp8_mma
    qkv_a = o_proj = router = "gemm"
    router_launch = moe = None
    deferred = False
    if fp8:
        qkv_a = "norm+fp8" if norm_linear_normalises(rows, cfg.hidden_size) else "fp8"
        o_proj = "fp8+add_norm"
    elif fused:
        qkv_a = ("norm_linear" if norm_linear_normalises(rows, cfg.hidden_size)
                 else "small_linear" if small_linear_rows(rows) else "gemm")
        o_proj = ("proj_norm" if ranks == 1 and proj_norm_rows(rows, cfg.hidden_size)
                  else "gemm")
    moe_layers = cfg.n_routed_experts and cfg.num_hidden_layers > cfg.first_k_dense_replace
    shared = precision = "none"
    if moe_layers:
        precision = experts_precision(weights, options.experts, device, dtype)
        experts_fp8 = precision == "fp8"
        experts = cfg.n_routed_experts
        if not fused or experts > ROUTER_MAX_EXPERTS:
            router = "torch"
        else:
            half = dtype in (torch.bfloat16, torch.float16)
            grouped = cfg.topk_method != "greedy"
            router_launch = launch_config(tokens, experts, cfg.hidden_size,
                                          (cfg.n_group or 1) if grouped else 1, half)
            router = "rows" if router_rows(tokens, options.router_few_rows) else "split"
        local_experts(experts, ranks, 0)  # a clear error where the experts do not split
        shared_width = (cfg.n_shared_experts or 0) * cfg.moe_intermediate_size
        if shared_width % ranks:
            raise ValueError(f"the shared experts' {shared_width} columns do not split evenly "
                             f"over {ranks} ranks")
        if options.experts == "triton":
            moe = pick_config(tokens, experts_fp8)
            if cfg.n_shared_experts:
                fold = fold_shared(tokens, shared_width // ranks, cfg.moe_intermediate_size,
                                   experts_fp8)
                shared = "folded" if fold else "apart"
            deferred = (ranks == 1 and bool(moe.last_sum)
                        and norm_linear_normalises(rows, cfg.hidden_size))
        elif cfg.n_shared_experts:
            shared = "apart"
    if max_query_len is None:
        form = "per step"
    else:
        form = attention_form(max_query_len, options.mha_min_query)
        if form == "mha" and seqs > 1:
            form = "absorbed+mha"
    cache = "fp8" if check_kv_dtype(kv_dtype) == "fp8" else str(dtype).removeprefix("torch.")
    decode = None
    if options.attention == "triton" and tokens == seqs and max_query_len == 1:
        decode = plan_decode(tokens, max_pages * page_size, device.sms,
                             cfg.num_attention_heads // ranks, page_size=page_size,
                             ws=device.sm90, fp8=cache == "fp8", dtype=dtype)
    nbytes, cuda = tokens * cfg.hidden_size * dtype.itemsize, device.type == "cuda"
    reduce = "none" if ranks == 1 else all_reduce_form(nbytes, cuda, options.one_shot, ranks)
    return StepPlan(tokens, seqs, options, device, qkv_a, o_proj, router, router_launch,
                    options.experts if moe_layers else "none", moe, shared, deferred, form,
                    decode, ranks, reduce,
                    ranks > 1 and reduce_norm_fused(
                        tokens, cfg.hidden_size, dtype.itemsize, cuda, options.fused,
                        options.reduce_norm, options.one_shot, ranks),
                    "fp8" if fp8 else str(dtype).removeprefix("torch."),
                    fp8_gemms(cfg, tokens, ranks) if fp8 else (), cache, precision)


def fp8_gemms(cfg: MLAConfig, rows: int, ranks: int = 1) -> tuple[tuple[str, str], ...]:
    """(projection, its block-FP8 GEMM's launch) for the step's projections at `rows` rows
    (`fp8_tiles`: the launch follows the product's shape), on one rank of `ranks`."""
    sizes = static_sizes(cfg, ranks)
    hidden = cfg.hidden_size
    shapes = {"qkv_a": (sizes["qkv_a"], hidden),
              "o_proj": (hidden, sizes["heads"] * cfg.v_head_dim)}
    if cfg.q_lora_rank:
        shapes["q_b"] = (sizes["heads"] * cfg.qk_head_dim, cfg.q_lora_rank)
    if cfg.first_k_dense_replace or not cfg.n_routed_experts:
        shapes |= {"mlp.gate_up": (2 * sizes["inter"], hidden),
                   "mlp.down": (hidden, sizes["inter"])}
    return tuple((name, _label(fp8_tiles(rows, *shape))) for name, shape in shapes.items())


__all__ = ["DeviceSpec", "EXPERTS_IMPLS", "KERNEL_DTYPES", "KernelOptions", "MHA_MIN_QUERY",
           "NORM_LINEAR_MAX_WIDTH", "ONE_SHOT_MAX_BYTES", "ONE_SHOT_MAX_SENT",
           "PROJ_NORM_MAX_ROWS", "PROJ_NORM_MAX_WIDTH", "ROUTER_MAX_EXPERTS", "ROUTER_ROWS_MAX",
           "SMALL_LINEAR_MAX_ROWS", "StepPlan", "WEIGHTS", "all_reduce_form",
           "attention_form", "default_options", "device_spec", "experts_precision",
           "fp8_gemm_runs", "fp8_gemms", "norm_linear_normalises", "one_shot_max_bytes",
           "options_for", "plan_step", "proj_norm_rows", "reduce_norm_fused", "router_rows",
           "small_linear_rows"]
