"""Skinny GEMM for decode: y[tokens, n] = x[tokens, k] @ W[n, k]^T at few tokens (<= 64).

At decode sizes the dense projections are weight-streaming: every weight byte is read once
and the arithmetic is free, so the kernel's job is to keep enough loads in flight on every SM.
One program owns a BLOCK_N slice of W's rows and all the tokens (padded to a power of two
>= 16 inside one tile, so `tl.dot` can use the tensor cores); when N / BLOCK_N alone gives too
few programs for ~2 waves of 132 SMs, K is split too. Split-K writes fp32 partials
[splits, tokens, n] and a second kernel sums them in a fixed order: no atomics, so results are
bitwise the same run to run and between eager and CUDA-graph replay. Block sizes come from a
small table (`pick_config`), never from run-time autotuning. The split-K scheme is the
classic one of CUTLASS's "split-K serial/parallel" GEMMs (NVIDIA, cutlass/media/docs).

`skinny_linear` is a `torch.library` custom op that picks the kernel or cuBLAS
(`F.linear`, better at large M) from the runtime token count, so a trace with symbolic tokens
keeps one node and does not specialise the choice.
"""

import os
from dataclasses import dataclass
from typing import no_type_check

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

MAX_TOKENS = 64  # above this cuBLAS is at least as fast
TARGET_PROGRAMS = 2 * 132  # two waves of an H100/H200's SMs


@dataclass(frozen=True)
class SkinnyConfig:
    block_m: int
    block_n: int
    block_k: int
    splits: int  # K is cut into `splits` chunks of `k_blocks_per_split * block_k`
    k_blocks_per_split: int
    num_warps: int = 4
    num_stages: int = 4


def pick_config(m: int, n: int, k: int) -> SkinnyConfig:
    """Tiles from (tokens, n, k); split-K only when the N tiles alone are under two waves and
    the fp32 partials stay small next to the weight (<= 1/4 of its bytes)."""
    block_m = max(16, triton.next_power_of_2(m))
    block_n = 32 if n <= 1024 else 128 if n >= 16384 else 64
    # 128-wide K: more K blocks per program to pipeline, and (stages - 1) x (W + x) tiles of
    # shared memory small enough for 2-3 programs per SM at block_m <= 32, block_n <= 64.
    block_k = 128
    n_tiles = triton.cdiv(n, block_n)
    k_blocks = triton.cdiv(k, block_k)
    splits = 1
    if n_tiles < TARGET_PROGRAMS:
        # partial bytes / weight bytes = splits * m * 4 / (k * 2)
        cap = max(1, k // (8 * max(m, 1)))
        splits = max(1, min(triton.cdiv(TARGET_PROGRAMS, n_tiles), k_blocks, cap))
    per_split = triton.cdiv(k_blocks, splits)
    return SkinnyConfig(block_m, block_n, block_k, triton.cdiv(k_blocks, per_split), per_split)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _skinny_kernel(x_ptr, w_ptr, out_ptr, M, N, K, K_BLOCKS_PER_SPLIT,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   EVEN_K: tl.constexpr, PARTIAL: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Clamp instead of masking the rows: the loads stay unmasked along M and N (the extra rows
    # are read from row M-1 / N-1 and never stored), so only K can need a mask.
    xm = tl.minimum(rm, M - 1).to(tl.int64)
    wn = tl.minimum(rn, N - 1).to(tl.int64)
    x_ptrs = x_ptr + xm[:, None] * K + rk[None, :]
    w_ptrs = w_ptr + wn[:, None] * K + rk[None, :]
    kb_start = split * K_BLOCKS_PER_SPLIT
    kb_end = tl.minimum(kb_start + K_BLOCKS_PER_SPLIT, tl.cdiv(K, BLOCK_K))
    x_ptrs += kb_start * BLOCK_K
    w_ptrs += kb_start * BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        if EVEN_K:
            x = tl.load(x_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_ok = (kb * BLOCK_K + rk) < K
            x = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    if PARTIAL:
        tl.store(out_ptr + split.to(tl.int64) * M * N + offs, acc, mask=mask)
    else:
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
@no_type_check
def _reduce_kernel(part_ptr, y_ptr, numel, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLITS):  # fixed order: bitwise reproducible
        acc += tl.load(part_ptr + s * numel + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def launch(x: Tensor, weight: Tensor, cfg: SkinnyConfig | None = None) -> Tensor:
    """Runs the kernel (any M up to the tile's rows); `cfg` overrides the table (tests)."""
    x = x.contiguous()
    weight = weight.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.zero_()
    cfg = cfg or pick_config(m, n, k)
    assert m <= cfg.block_m, (m, cfg)
    even_k = k % cfg.block_k == 0
    grid = (triton.cdiv(n, cfg.block_n), cfg.splits)
    opts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=even_k,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.splits == 1:
        _skinny_kernel[grid](x, weight, y, m, n, k, cfg.k_blocks_per_split, PARTIAL=False,
                             **opts)
        return y
    part = torch.empty((cfg.splits, m, n), dtype=torch.float32, device=x.device)
    _skinny_kernel[grid](x, weight, part, m, n, k, cfg.k_blocks_per_split, PARTIAL=True, **opts)
    block = 1024
    _reduce_kernel[(triton.cdiv(m * n, block),)](part, y, m * n, SPLITS=cfg.splits,
                                                 BLOCK=block, num_warps=4)
    return y


def _use_kernel(x: Tensor, weight: Tensor) -> bool:
    # On the CPU only under the interpreter, and only in float32 (its bf16 dot is wrong).
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" and x.dtype == torch.float32
    return (x.dim() == 2 and x.shape[0] <= MAX_TOKENS and x.dtype == weight.dtype
            and (x.is_cuda or interpreted))


@torch.library.custom_op("mla_func::skinny_linear", mutates_args=())
def skinny_linear(x: Tensor, weight: Tensor) -> Tensor:
    if _use_kernel(x, weight):
        return launch(x, weight)
    return F.linear(x, weight)


@skinny_linear.register_fake
def _(x, weight):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear(x: Float[Tensor, "tokens k"], weight: Float[Tensor, "n k"]
           ) -> Float[Tensor, "tokens n"]:
    """x @ weight.T: the skinny kernel at <= 64 tokens on CUDA, cuBLAS otherwise."""
    return torch.ops.mla_func.skinny_linear(x, weight)
