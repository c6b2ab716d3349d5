"""The last launch of the fused MoE (`fused_moe.fused_experts`): each token's pair rows, as the
down GEMM (`moe_gemm.down_kernel`) wrote them, summed in fp32 (+ the shared experts' output
when they ran apart), optionally with the residual add and the next layer's RMSNorm
(`norm.add_rmsnorm`'s numerics).
"""

from typing import no_type_check

import triton
import triton.language as tl

from mla_func.kernels.norm import rms_scaled


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _pair_sum(buf_ptr, extra_ptr, t, offs, ok, n_hidden, PAIRS_PER_TOKEN: tl.constexpr,
              HAS_EXTRA: tl.constexpr):
    """Token t's pair rows (+ its extra row) summed in fp32 over the columns `offs`."""
    acc = tl.zeros(offs.shape, dtype=tl.float32)
    if HAS_EXTRA:  # the shared experts' output, when computed apart
        acc += tl.load(extra_ptr + t * n_hidden + offs, mask=ok, other=0.0).to(tl.float32)
    for j in tl.static_range(PAIRS_PER_TOKEN):
        row = t * PAIRS_PER_TOKEN + j
        acc += tl.load(buf_ptr + row * n_hidden + offs, mask=ok, other=0.0).to(tl.float32)
    return acc


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def sum_kernel(buf_ptr, extra_ptr, out_ptr, res_ptr, y_ptr, w_ptr, n_hidden, eps,
               PAIRS_PER_TOKEN: tl.constexpr, HAS_EXTRA: tl.constexpr, ADD_NORM: tl.constexpr,
               BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out[t] = the sum of token t's pair rows (+ extra[t]), rounded to out's dtype, BLOCK
    columns a program. ADD_NORM (one program a row, BLOCK >= n_hidden: the row stays in
    registers): out[t] = res[t] + that sum and y[t] = rmsnorm(out[t]) * w, with
    `norm.add_rmsnorm`'s rounding (the sum, then the residual add, in out's dtype). PDL
    (sm90): let the launch after (the next layer's first projection, `small_linear`) start
    now and load its weights."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    dt = out_ptr.dtype.element_ty
    if ADD_NORM:
        offs = tl.arange(0, BLOCK)
        ok = offs < n_hidden
        acc = _pair_sum(buf_ptr, extra_ptr, t, offs, ok, n_hidden, PAIRS_PER_TOKEN, HAS_EXTRA)
        r = tl.load(res_ptr + t * n_hidden + offs, mask=ok, other=0.0).to(tl.float32)
        h = (r + acc.to(dt).to(tl.float32)).to(dt)
        tl.store(out_ptr + t * n_hidden + offs, h, mask=ok)
        hf = h.to(tl.float32)
        y = rms_scaled(hf, tl.sum(hf * hf, axis=0), n_hidden, eps, w_ptr, offs, ok, dt)
        tl.store(y_ptr + t * n_hidden + offs, y.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n_hidden
        acc = _pair_sum(buf_ptr, extra_ptr, t, offs, ok, n_hidden, PAIRS_PER_TOKEN, HAS_EXTRA)
        tl.store(out_ptr + t * n_hidden + offs, acc.to(dt), mask=ok)
