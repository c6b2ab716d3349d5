"""The block-FP8 form of the grouped expert GEMMs' K step (`gate_up.py`, `down.py` with FP8):
DeepSeek-V3's fine-grained quantisation (arXiv:2412.19437, 3.3) as its inference code runs it
(`act_quant` + `fp8_gemm`): weights in e4m3 with one float32 scale per block of rows x 128
columns (`fp8.Fp8Weight`), activations quantised per token in groups of 128 columns (scale
amax / 448; `act_quant.quant_rows`), each K step of 128 columns one e4m3 `tl.dot` whose
fp32 result is scaled by the row's activation scale times the columns' weight scales and
added to an fp32 accumulator (`mma`; within a K step the tensor cores' own accumulation, as
DeepSeek's promotion to fp32 every 128 columns).

Here the activations are quantised inside the K loop, from the rows the bf16 kernels load (x
gathered by pair, `act` in the down GEMM), so the layouts, the tiles, the epilogues and the
launches stay the bf16 kernels'. A weight scale is loaded per output column (its row block),
so the block rows may be any size (a grid cut finer by heads or tensor-parallel slices).
Few-row tiles (the decode rows, block_m 16) multiply swapped, w x^T (`mma`'s SWAP,
`kernels.swap_ab`): the e4m3 bytes then reach the tensor cores unconverted.

The cast to e4m3 rounds to nearest even on a GPU. Triton's interpreter (3.9) does not: its
float-to-fp8 conversion drops the carry of a mantissa that rounds up into the exponent (7.9
becomes 4) and truncates subnormals. Off CUDA the kernels therefore first round in fp32 to
e4m3's grid (`ROUND`, chosen by the launch from the device), so that the cast is exact.
`ops.moe_fp8` is the torch reference of these numerics.

`Fp8Scales` carries the scales beside the e4m3 weights `fused_experts` takes as its weights;
`launch_args` turns them into a GEMM launch's arguments, `shared_as_experts` slices a shared
MLP's like its weights (`fused.shared_as_experts`).
"""

from dataclasses import dataclass
from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float32
from torch import Tensor

from mla_func.kernels.act_quant import quant_tokens
from mla_func.kernels.moe.config import FP8_BLOCK_K as GROUP


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def scale_ptrs(q_ptr, qs_ptr, e, n_routed, offs_n, stride_qe, stride_qn, stride_sqe,
               stride_sqn, blk_n, s_blk_n):
    """Pointers to the weight scales of expert e's rows offs_n at K block 0 (the next blocks
    follow contiguously): a routed expert's, or past `n_routed` a shared slice's."""
    if e < n_routed:
        ptrs = q_ptr + e.to(tl.int64) * stride_qe + (offs_n // blk_n) * stride_qn
    else:
        ptrs = qs_ptr + (e - n_routed).to(tl.int64) * stride_sqe + (offs_n // s_blk_n) * stride_sqn
    return ptrs


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def mma(a, b, acc, a_s, b_s, PRECISION: tl.constexpr, FP8: tl.constexpr,
        SWAP: tl.constexpr = False):
    """acc + a b: with FP8 one K step of e4m3 tiles, its fp32 product scaled per row (a_s)
    and per column (b_s) before it is added; SWAP: acc and the product [columns, rows]
    (b^T a^T, `kernels.swap_ab`), the same scales."""
    if SWAP:
        acc += tl.dot(tl.trans(b), tl.trans(a)) * (a_s[None, :] * b_s[:, None])
    elif FP8:
        acc += tl.dot(a, b) * (a_s[:, None] * b_s[None, :])
    else:
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


def _quantised(rows: Tensor, option: str, on: bool, fp8: bool) -> tuple[Tensor, Tensor | None]:
    """`rows` and no scales, or with `MoEConfig.<option>` on (block-FP8 experts only) their
    `quant_tokens` image and scales."""
    if not on:
        return rows, None
    if not fp8:
        raise ValueError(f"MoEConfig.{option} quantises for block-FP8 experts; these are not")
    return quant_tokens(rows, GROUP)


def gate_up_x(x: Tensor, quant_x: bool, fp8: bool) -> tuple[Tensor, dict]:
    """The gate_up launch's x and its keyword arguments (`MoEConfig.quant_x`)."""
    x, s = _quantised(x, "quant_x", quant_x, fp8)
    return x, {} if s is None else dict(xs_ptr=s, stride_xs=s.stride(0), XQ=True)


def down_act(act: Tensor, quant_act: bool, fp8: bool) -> tuple[Tensor, dict]:
    """The down launch's `act` and its keyword arguments (`MoEConfig.quant_act`)."""
    act, s = _quantised(act, "quant_act", quant_act, fp8)
    return act, {} if s is None else dict(as_ptr=s, AQ=True)


@dataclass(frozen=True)
class Fp8Scales:
    """The block scales of block-FP8 expert weights, whose e4m3 data `fused_experts` takes in
    the weights' place: float32, one per block of `rows` (gate_up's, down's) x GROUP of each
    matrix, in the weights' layout (the last axis contiguous); the shared MLP's likewise
    (`shared_rows`) when it is given."""

    gate_up: Float32[Tensor, "experts 2 _blocks_out _blocks_in"]
    down: Float32[Tensor, "experts _blocks_out _blocks_in"]
    rows: tuple[int, int]
    shared_gate_up: Float32[Tensor, "2 _blocks_out _blocks_in"] | None = None
    shared_down: Float32[Tensor, "_blocks_out _blocks_in"] | None = None
    shared_rows: tuple[int, int] = (GROUP, GROUP)


def check_scales(w: Tensor, scales: Tensor, rows: int, what: str) -> None:
    """A ValueError unless `scales` are w's on a grid of `rows` x GROUP (w's last two axes the
    matrix, its leading ones the scales' too) with a contiguous last axis."""
    out, cols = w.shape[-2:]
    want = (*w.shape[:-2], triton.cdiv(out, rows), triton.cdiv(cols, GROUP))
    if tuple(scales.shape) != want or (want[-1] > 1 and scales.stride(-1) != 1):
        raise ValueError(f"{what}: block scales {tuple(scales.shape)} (strides "
                         f"{scales.stride()}) are not those of {tuple(w.shape)} in blocks of "
                         f"{rows} x {GROUP} with a contiguous last axis: expected {want}")


def shared_as_experts(
    gate_up: Float32[Tensor, "2 _blocks_out _blocks_in"],
    down: Float32[Tensor, "_blocks_out _blocks_in"],
    rows: tuple[int, int], inter: int, moe_inter: int,
) -> tuple[Float32[Tensor, "shared 2 _blocks_out _blocks_in"],
           Float32[Tensor, "shared _blocks_out _blocks_in"]]:
    """A shared MLP's scales (width `inter`) cut like its weights into inter / moe_inter
    experts of moe_inter (strided views): each expert's rows whole blocks of gate_up's, its
    columns whole GROUPs of down's."""
    if moe_inter % rows[0] or moe_inter % GROUP:
        raise ValueError(f"block-FP8 shared experts of {moe_inter} columns do not fold into the "
                         f"routed launches in blocks of {rows[0]} rows and {GROUP} columns")
    n = inter // moe_inter
    gu = gate_up.view(2, n, moe_inter // rows[0], gate_up.shape[-1]).transpose(0, 1)
    dn = down.view(down.shape[0], n, moe_inter // GROUP).transpose(0, 1)
    return gu, dn


def check_weights(gate_up: Tensor, down: Tensor, shared_gate_up: Tensor | None,
                  shared_down: Tensor | None, scales: Fp8Scales) -> None:
    """A ValueError unless the weights are e4m3 with `scales` on a grid of whole GROUPs of
    columns (a shared MLP's too, given)."""
    pairs = [(gate_up, scales.gate_up, scales.rows[0], "gate_up"),
             (down, scales.down, scales.rows[1], "down")]
    if shared_gate_up is not None:
        if scales.shared_gate_up is None or scales.shared_down is None:
            raise ValueError("block-FP8 experts with a shared MLP need its scales too")
        pairs += [(shared_gate_up, scales.shared_gate_up, scales.shared_rows[0],
                   "shared gate_up"),
                  (shared_down, scales.shared_down, scales.shared_rows[1], "shared down")]
    for w, q, rows, what in pairs:
        if w.dtype != torch.float8_e4m3fn:
            raise ValueError(f"block-FP8 experts: {what} is {w.dtype}, not float8_e4m3fn")
        check_scales(w, q, rows, what)


def gemm_args(scales: Fp8Scales, shared: tuple[Tensor, Tensor] | None, device_type: str
              ) -> tuple[dict, dict]:
    """The FP8 keyword arguments of the gate_up and the down launch: the routed experts'
    scales and the shared experts' (`shared`, cut into experts: `shared_as_experts`; None:
    none ride along, the routed ones stand in)."""
    rows = scales.shared_rows
    if shared is None:
        shared, rows = (scales.gate_up, scales.down), scales.rows
    return (launch_args(scales.gate_up, shared[0], scales.rows[0], rows[0], device_type, True),
            launch_args(scales.down, shared[1], scales.rows[1], rows[1], device_type, False))


def launch_args(routed: Tensor, shared: Tensor, rows: int, shared_rows: int, device_type: str,
                gate_up: bool) -> dict:
    """A grouped GEMM launch's FP8 keyword arguments: the routed and shared experts' scales
    ([experts, (2,) blocks_out, blocks_in]) with their strides and block rows, and ROUND off
    CUDA (the module docstring)."""
    lead = ("qe", "qg", "qn") if gate_up else ("qe", "qn")
    out = dict(q_ptr=routed, qs_ptr=shared, blk_n=rows, s_blk_n=shared_rows, FP8=True,
               ROUND=device_type != "cuda")
    for i, name in enumerate(lead):
        out[f"stride_{name}"] = routed.stride(i)
        out[f"stride_s{name}"] = shared.stride(i)
    return out
