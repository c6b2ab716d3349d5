"""The warp-specialised 64-head MLA decode (kernels/attention/decode_ws.py) without a GPU: its sm90
ahead-of-time compile (Gluon: wgmma, TMA, three partitions), the plans that pick it, and the
cases it refuses. Its numerics run on an sm90 GPU (test_kernels_mla_ws_cuda.py): Gluon has no
interpreter."""

import torch
from sm90_ptxas import run_compile_script

from mla_func.kernels.attention import decode_ws as ws
from mla_func.kernels.attention.decode_plan import plan_decode

_SM90 = r"""
import re, torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
from sm90_ptxas import ptxas_usage
from mla_func.kernels.attention import decode_ws as ws

bf, i32 = torch.bfloat16, torch.int32
heads, rows, splits = 128, 32, 4
for block_n, stages, split, page, early in (
        (32, 4, True, 64, False), (64, 2, True, 64, False), (32, 3, False, 64, False),
        (32, 4, True, 1, False), (32, 4, True, 16, False), (32, 4, True, 64, True),
        (32, 4, False, 16, True)):
    n = splits if split else 1
    grid, args, kwargs = ws.ws_launch(
        torch.empty(heads, rows, 512, dtype=bf), torch.empty(rows, heads, 64, dtype=bf),
        torch.empty(rows * 4096 // page + 1, page, 576, dtype=bf),
        torch.empty(rows, 4096 // page, dtype=i32),
        torch.empty(rows, dtype=i32), torch.empty(rows, dtype=i32), 0.07, n, block_n, stages,
        torch.empty(heads, rows, 512, dtype=bf), torch.empty(rows, heads, n, 512),
        torch.empty(rows, heads, n), early)
    opts = {"num_warps": kwargs.pop("num_warps")}
    assert kwargs.pop("launch_pdl", False) == early
    kern = ws._decode_ws_kernel
    sig, attrs = {}, {}
    for i, (name, v) in enumerate(zip(kern.arg_names, args + tuple(kwargs.values()))):
        if name in kwargs:
            sig[name] = "constexpr"
        elif isinstance(v, float):
            sig[name] = "fp32"
        elif isinstance(v, int):
            sig[name] = "i32"
            if v % 16 == 0 and name != "num_splits":
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = mangle_type(v)
            if torch.is_tensor(v):
                attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(GluonASTSource(kern, sig, kwargs, attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    regs, spills, _ = ptxas_usage(k)
    ptx = k.asm["ptx"]
    shapes = set(re.findall(r"wgmma.mma_async.sync.aligned.(m\d+n\d+k\d+)", ptx))
    print("ws", block_n, stages, split, page, "regs", regs, "spills", spills, "smem",
          k.metadata.shared, shapes)
    # With the GPU machines' Triton 3.6 nothing spills (2026-11-24); 3.9 spills 12 bytes at
    # 32-key tiles and 96 at 64.
    assert spills <= 128
    assert k.metadata.shared <= 232448  # sm90's shared memory per block: one program a SM
    # The score product at n = block_n and the value products in 64-column chunks.
    assert shapes == {f"m64n{block_n}k16", "m64n64k16"}, shapes
    # A key tile: 9 TMA boxes of 64 columns, or, gathered, 9 x 16-byte cp.async a thread (32
    # keys x 576 x 2 bytes over 128 threads) arriving on the tile's barrier; q_lat: 8 boxes.
    # Early, the loader's tile loads appear twice (before and after its wait).
    gather, copies = page % block_n != 0, 2 if early else 1
    assert len(re.findall(r"cp.async.bulk.tensor", ptx)) == (0 if gather else 9) * copies + 8
    assert len(re.findall(r"cp.async.cg.shared.global", ptx)) == (18 if gather else 0) * copies
    assert ("cp.async.mbarrier.arrive.noinc" in ptx) == gather
    assert "mbarrier.try_wait" in ptx
    # Early: the loader's and the score warpgroup's waits for the kernel before.
    assert len(re.findall(r"griddepcontrol.wait", ptx)) == (2 if early else 0), early
"""


def test_ws_compiles_for_sm90():
    """Ahead-of-time sm90 compile (no GPU needed) of the tile configurations the plans and
    the GPU tests use: within sm90's shared memory per block, 9 TMA boxes a key tile (or, at
    pages under a tile, per-key cp.async gathers) and 8 for q_lat, wgmma at the tile's key
    count and in 64-column value chunks; launched early, two waits for the kernel before."""
    out = run_compile_script(_SM90, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def test_ws_plans():
    """On an sm90 device the 128-head plans take the kernel with the fewest splits that fill
    one wave (one program a SM), at any page size, launched early up to 4 rows; 16 heads,
    short splits and other devices keep the Triton plans."""
    for rows, splits in ((128, 1), (32, 2), (8, 8), (4, 15), (1, 57)):
        plan = plan_decode(rows, 8256, 132, 128, page_size=64, ws=True)
        assert plan.ws and (plan.block_h, plan.block_n, plan.num_stages) == (64, 32, 4)
        assert plan.num_splits == splits and not plan.shared_p
        assert plan.early == (rows <= 4)  # launched behind the absorb kernel at a few rows
    assert plan_decode(1, 4096, 132, 128, ws=True).num_splits == 57
    assert not plan_decode(1, 1024, 132, 128, ws=True).ws  # 32 splits of 32 keys: Triton
    assert not plan_decode(32, 8256, 132, 16, ws=True).ws
    assert plan_decode(32, 8256, 132, 128, page_size=1, ws=True).ws  # gathered key tiles
    assert not plan_decode(32, 8256, 132, 128).ws


def test_ws_refuses_off_sm90():
    """Off an sm90 device the kernel is not taken, whatever the cache."""
    cache = torch.zeros(3, 64, 576, dtype=torch.bfloat16)
    assert not ws.device_ok(cache.device)
    assert not ws.supported(cache, 128, 32)
