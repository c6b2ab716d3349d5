"""The rules one plan decides by: what it knows of a device and the shape thresholds.

`DeviceSpec` (a device's type, SM count and capability: PDL, e4m3 products, sm90's warp
specialisation) and the predicates `plan.plan_step` applies to a step's static shape, which
each kernel's op applies again to its own shapes at run time (a traced step serves every
bucket): the few-row projections, the router's few-row form, the sums over ranks and their
fused end, the experts' precision, the attention's form. Each constant is the measured
threshold of docs/DECISIONS.md. `kernels.plan` re-exports all of them: callers import the
plan.
"""

from dataclasses import dataclass

import torch

EXPERTS_IMPLS = ("reference", "sorted_torch", "triton")

# Rows up to which the few-row kernels run (docs/DECISIONS.md).
PROJ_NORM_MAX_ROWS = 4  # o_proj + residual add + RMSNorm in one launch
PROJ_NORM_MAX_WIDTH = 2048  # ... for rows up to this wide (its last program holds a row)
SMALL_LINEAR_MAX_ROWS = 1  # x w^T with the weights loaded before the PDL wait
NORM_LINEAR_MAX_WIDTH = 2048  # norm_linear normalises the residual row itself up to this width
ROUTER_ROWS_MAX = 4  # the router's one-program-an-expert form
ROUTER_MAX_EXPERTS = 256  # the fused router's widest expert block; more route in torch
# A step holding a sequence with this many new tokens runs its prompts in the MHA form.
MHA_MIN_QUERY = 64
# Several GPUs: an all-reduce of up to this many bytes (128 rows of V3's 7168, bf16: decode
# steps) runs the pushed one-shot sum (`kernels.collective.push_sum`: every rank's rows stored
# into the others' symmetric buffers over NVLink, one launch) instead of NCCL's
# (docs/DECISIONS.md, `kernels.plan.ONE_SHOT_MAX_BYTES`)...
ONE_SHOT_MAX_BYTES = 128 * 7168 * 2
# ... while a rank sends at most this many bytes (its rows to each of ranks - 1 peers): at 4
# ranks the pushed sum of 128 rows of 7168 (1.8 MB to each of 3 peers) took NCCL's time (27.4
# against 27.7 us, 4 x H200, 61be8d8); 8 ranks are unmeasured (`one_shot_max_bytes`).
ONE_SHOT_MAX_SENT = 3 * ONE_SHOT_MAX_BYTES
# What `plan_step(weights=...)` names: float weights, or block FP8 (`fp8.Fp8Weight`).
WEIGHTS = ("bf16", "fp8")
# The weights' dtypes the fused kernels and the triton attention backend are tuned for: their
# tiles are sized for 2-byte operands, and float32 doubles their shared memory (a V3-shaped
# float32 step asked a kernel for 409,624 bytes of it; an H100 has 232,448).
KERNEL_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class DeviceSpec:
    """What the plan needs to know of a device."""

    type: str
    sms: int
    capability: tuple[int, int] = (0, 0)

    @property
    def pdl(self) -> bool:
        return self.type == "cuda" and self.capability[0] >= 9

    @property
    def fp8_mma(self) -> bool:
        """e4m3 tensor-core products, tl.dot on e4m3 operands (sm89 and later; elsewhere than
        CUDA: the interpreter, or `meta`, which plans for such a GPU): the block-FP8 GEMMs
        run."""
        return self.type != "cuda" or self.capability >= (8, 9)

    @property
    def sm90(self) -> bool:
        """wgmma and TMA: the warp-specialised decode kernel runs."""
        return self.type == "cuda" and self.capability[0] == 9



def device_spec(device: torch.device | str) -> DeviceSpec:
    """A device's spec; elsewhere than CUDA a small stand-in SM count (the interpreter has no
    SMs)."""
    device = torch.device(device)
    if device.type != "cuda":
        return DeviceSpec(device.type, 4)
    props = torch.cuda.get_device_properties(device)
    return DeviceSpec("cuda", props.multi_processor_count, (props.major, props.minor))


def proj_norm_rows(rows: int, width: int) -> bool:
    """Whether o_proj + add + norm of `rows` rows `width` wide run as one launch."""
    return 0 < rows <= PROJ_NORM_MAX_ROWS and width <= PROJ_NORM_MAX_WIDTH


def small_linear_rows(rows: int) -> bool:
    """Whether x w^T of `rows` rows runs the matrix-vector kernel (else a GEMM)."""
    return 0 < rows <= SMALL_LINEAR_MAX_ROWS


def norm_linear_normalises(rows: int, width: int) -> bool:
    """Whether the layer's first projection normalises its residual rows itself (one program
    holds the row), so that the op before it may leave the norm unwritten (the deferred norm,
    `mla_func.kernel_ops`)."""
    return small_linear_rows(rows) and width <= NORM_LINEAR_MAX_WIDTH


def fp8_gemm_runs(device: torch.device) -> bool:
    """Whether the fused path multiplies block-FP8 weights in FP8 on `device` (else it
    dequantises them, as the reference does): `DeviceSpec.fp8_mma`."""
    return device_spec(device).fp8_mma


def router_rows(tokens: int, few_rows: bool) -> bool:
    """Whether the router runs one program an expert (else its split kernel), given
    `KernelOptions.router_few_rows`."""
    return few_rows and 0 < tokens <= ROUTER_ROWS_MAX


def one_shot_max_bytes(ranks: int) -> int:
    """The largest sum over `ranks` ranks that runs one-shot: ONE_SHOT_MAX_BYTES, and no more
    than ONE_SHOT_MAX_SENT sent by each rank (16-byte multiples)."""
    return min(ONE_SHOT_MAX_BYTES, ONE_SHOT_MAX_SENT // max(ranks - 1, 1)) // 16 * 16


def all_reduce_form(nbytes: int, cuda: bool, one_shot: bool, ranks: int) -> str:
    """'one_shot' (the pushed sum over symmetric memory) for sums of up to
    `one_shot_max_bytes(ranks)` on CUDA, else 'nccl' (or gloo's)."""
    small = nbytes <= one_shot_max_bytes(ranks)
    return "one_shot" if one_shot and cuda and small else "nccl"


def reduce_norm_fused(rows: int, width: int, itemsize: int, cuda: bool, fused: bool,
                      reduce_norm: bool, one_shot: bool, ranks: int) -> bool:
    """Whether a sub-layer's sum over `ranks` ranks of `rows` rows `width` wide, its residual
    add and its norm run as one launch (`kernels.collective.push_sum`): at every one-shot
    size with the fused kernels on (the options' `fused`, `reduce_norm`, `one_shot`; it
    measured as fast as the sum and then the add + norm or faster at 1-128 rows of 2048 and
    7168, docs/DECISIONS.md)."""
    one = all_reduce_form(rows * width * itemsize, cuda, one_shot, ranks) == "one_shot"
    return fused and reduce_norm and one


def experts_precision(weights: str, experts: str, device: DeviceSpec,
                      dtype: torch.dtype = torch.bfloat16) -> str:
    """How the experts' GEMMs compute, given the weights ("bf16": float, in `dtype`; "fp8":
    block FP8) and the experts' implementation: "fp8" (the Triton experts' block-FP8 GEMMs,
    `kernels.moe.fp8_gemm`, on a device whose tl.dot takes e4m3), "dequantised" (FP8 weights
    dequantised to the activations' dtype on the fly, every other implementation), or the
    float weights' dtype ("bfloat16")."""
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; expected one of {WEIGHTS}")
    if weights == "fp8":
        return "fp8" if experts == "triton" and device.fp8_mma else "dequantised"
    return str(dtype).removeprefix("torch.")


def attention_form(max_query_len: int, mha_min_query: int = MHA_MIN_QUERY) -> str:
    """'mha' when a sequence brings `mha_min_query` new tokens or more, else 'absorbed'."""
    return "mha" if max_query_len >= mha_min_query else "absorbed"


__all__ = ["DeviceSpec", "EXPERTS_IMPLS", "KERNEL_DTYPES", "MHA_MIN_QUERY",
           "NORM_LINEAR_MAX_WIDTH", "ONE_SHOT_MAX_BYTES", "ONE_SHOT_MAX_SENT",
           "PROJ_NORM_MAX_ROWS", "PROJ_NORM_MAX_WIDTH", "ROUTER_MAX_EXPERTS", "ROUTER_ROWS_MAX",
           "SMALL_LINEAR_MAX_ROWS", "WEIGHTS", "all_reduce_form",
           "attention_form", "device_spec", "experts_precision", "fp8_gemm_runs",
           "norm_linear_normalises", "one_shot_max_bytes", "proj_norm_rows",
           "reduce_norm_fused", "router_rows", "small_linear_rows"]
