"""The experts' block-FP8 GEMMs on the GPU (and ahead-of-time sm90 compiles of them): V2-Lite's
shapes in bf16 through `mla_func.moe.experts` against `ops.moe_fp8`, and the K-split GEMMs
(`MoEConfig.gate_up_split`, `down_split`) bitwise across calls and graph replays. The CPU
tests of the same kernels: test_moe_fp8.py."""

import dataclasses

import pytest
import torch
from moe_fp8_helpers import LOOSE, float_experts, fused_fp8, make_fp8, rel_err
from moe_helpers import close
from sm90_ptxas import run_compile_script

from mla_func.kernels.moe.config import pick_config
from mla_func.moe import experts
from mla_func.ops.moe_fp8 import experts_fp8

# Ahead-of-time sm90 compiles (no GPU) of the FP8 kernels at V2-Lite sizes, every distinct
# (kernel, tile, path) of the FP8 rows, as `fused_experts` launches them: ptxas must report no
# spill (the rows were chosen so: `config.FP8_CONFIGS`).
_AOT = """
from sm90_ptxas import compile_sm90
from mla_func.kernels.moe.config import FP8_CONFIGS, FP8_SPILLS
from mla_func.kernels.moe.down import down_kernel
from mla_func.kernels.moe.gate_up import gate_up_kernel
ptrs = dict(weights_ptr="*fp32", ids_ptr="*i64", sorted_ptr="*i32", block_expert_ptr="*i32",
            block_rows_ptr="*i32", counter_ptr="*i32", eps="fp32", q_ptr="*fp32",
            qs_ptr="*fp32", w_ptr="*fp8e4nv", ws_ptr="*fp8e4nv")
seen, bad = set(), []
for bound, cfg in FP8_CONFIGS:
    bm = 16 if cfg.direct else cfg.block_m
    for fn, (bn, bk, warps, stages) in ((gate_up_kernel, cfg.gate_up), (down_kernel, cfg.down)):
        gate = fn is gate_up_kernel
        const = dict(PAIRS_PER_TOKEN=8, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PRECISION="tf32",
                     EVEN_K=True, FP8=True, ROUND=False, DIRECT=cfg.direct, TMA=cfg.tma,
                     MERGE_TAIL=cfg.merge_tail, LOCAL=False)
        types = ptrs
        if gate:
            const.update(PDL=True, INLINE=cfg.inline_align, E_P2=128 if cfg.inline_align else 2,
                         P_BLOCK=(256 if bm == 16 else 1024) if cfg.inline_align else 1,
                         XQ=cfg.quant_x, SPLIT=cfg.gate_up_split)
            if cfg.quant_x:  # x comes quantised, its scales beside it
                types = dict(ptrs, x_ptr="*fp8e4nv", xs_ptr="*fp32")
            if cfg.gate_up_split > 1:  # K split: float32 partials, a counter a tile
                types = dict(types, part_ptr="*fp32", cnt_ptr="*i32")
        else:
            last = cfg.last_sum
            const.update(LAST_SUM=last, HAS_EXTRA=False, ADD_NORM=last, TRIGGER=last,
                         SUM_BLOCK=2048 if last else 1, AQ=cfg.quant_act)
            if cfg.quant_act:  # act comes quantised, its scales beside it
                types = dict(ptrs, act_ptr="*fp8e4nv", as_ptr="*fp32")
            if not cfg.merge_tail:
                const["act_tail_desc"] = None
            const["SPLIT"] = cfg.down_split
            if cfg.down_split > 1:  # K split: float32 partials, a counter a tile
                types = dict(types, part_ptr="*fp32", cnt_ptr="*i32")
        if not cfg.tma:
            const.update(w_desc=None, **({} if gate else dict(act_desc=None)))
        key = (gate, bm, bn, warps, stages, tuple(sorted(const.items())))
        if key in seen:
            continue
        seen.add(key)
        w_block = f"1, 2, {bn}, {bk}" if gate else f"{bn}, {bk}"
        act = "fp8e4nv" if cfg.quant_act else "bf16"
        descs = dict(w_desc=f"tensordesc<fp8e4nv[{w_block}]>",
                     act_desc=f"tensordesc<{act}[{bm}, {bk}]>",
                     act_tail_desc=f"tensordesc<{act}[{bm // 2}, {bk}]>")
        spills, report = compile_sm90(fn, const, types, descs, warps, stages)
        if spills and bound not in FP8_SPILLS:
            bad.append((bound, fn.__name__, spills))
assert not bad, bad
"""


@pytest.mark.cuda  # ~40 s of compiles, no GPU needed: with the GPU tests (their Triton's ptxas)
def test_fp8_rows_compile_for_sm90_without_spills():
    """Every FP8 row but those measured faster with their spills (`FP8_SPILLS`; the first
    row's kernels compile on every run: test_moe_cuda.py's
    `test_compiles_for_sm90_at_v2_lite_sizes`)."""
    out = run_compile_script(_AOT, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


# ---- GPU: V2-Lite shapes, bf16 --------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 7, 100, 600, 3000])  # direct, inline, aligned, TMA (+tails)
def test_cuda_fp8_experts_at_v2_lite_shapes(tokens):
    """64 experts top-6, hidden 2048, moe_inter 1408 (11 groups), 2 shared experts (folded up
    to 512 tokens, apart past it), bf16 activations: the Triton FP8 path through
    `mla_func.moe.experts` against `ops.moe_fp8` (the tensor cores' fp8 sums of a group, and
    the bf16 activation's rounding before its quantisation, apart: 2% of the norm) and against
    the float experts of the dequantised weights (the activations' e4m3 rounding, `LOOSE`)."""
    x, w, ids, gu, dn, mlp = make_fp8(tokens, 6, 64, 2048, 1408, 2, seed=tokens, device="cuda",
                                      dtype=torch.bfloat16)
    got = experts(x, w, ids, gu, dn, mlp, impl="triton")
    assert got.dtype == torch.bfloat16
    want = experts_fp8(x, w, ids, gu, dn, mlp, fold=tokens <= 512)
    # 1.3% at 100 tokens on an H200: each GEMM's tensor-core sums sit ~0.3% from float32
    # (tests/test_kernels_fp8_linear.py), and the SwiGLU activations they give are quantised
    # again, where one value rounded to its other e4m3 neighbour moves by up to 12%.
    assert rel_err(got, want) < 2e-2
    close(got, want, 0.05)
    assert rel_err(got, float_experts(x, w, ids, gu, dn, mlp)) < LOOSE


@pytest.mark.cuda
@pytest.mark.parametrize("tokens,split,down_split", [(1, 3, 1), (1, 2, 2), (4, 2, 3)])
def test_cuda_fp8_split_gemms_replay_bitwise(tokens, split, down_split):
    """gate_up's and down's K in slices (`MoEConfig.gate_up_split`, `down_split`, the direct
    layout) at V2-Lite's shapes: the unsplit layer's output but for the order of its float32
    sums (which the bf16 `act` and pair rows mostly round away), the same bits on every call
    and in a CUDA graph's replay (the last slice to arrive sums in slice order), and the
    reference's `ops.moe_fp8` as close as the unsplit layer is."""
    x, w, ids, gu, dn, mlp = make_fp8(tokens, 6, 64, 2048, 1408, 2, seed=tokens, device="cuda",
                                      dtype=torch.bfloat16)
    cfg = dataclasses.replace(pick_config(tokens, fp8=True), direct=True, gate_up_split=split,
                              down_split=down_split)
    got = fused_fp8(x, w, ids, gu, dn, mlp, cfg)
    whole = fused_fp8(x, w, ids, gu, dn, mlp,
                      dataclasses.replace(cfg, gate_up_split=1, down_split=1))
    assert rel_err(got, whole) < 1e-2
    assert rel_err(got, experts_fp8(x, w, ids, gu, dn, mlp, fold=True)) < 2e-2
    for _ in range(5):
        assert torch.equal(fused_fp8(x, w, ids, gu, dn, mlp, cfg), got)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture
        fused_fp8(x, w, ids, gu, dn, mlp, cfg)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_fp8(x, w, ids, gu, dn, mlp, cfg)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, got)
