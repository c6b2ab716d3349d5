"""Ahead-of-time sm90 compile of the MLA decode, merge and fused absorb + cache write kernels
(no GPU needed): register use, spills and the number of KV buffers the pipeliner allocates, at
V2-Lite / V3 sizes; the merge fused with W_UV (mla_merge_uv) and the output projection +
add + norm launched after it (proj_norm); the few-row linear layer (small_linear)."""

from sm90_ptxas import run_compile_script

_SM90 = r"""
import re
from dataclasses import replace
import torch, triton
from triton.backends.compiler import GPUTarget
from sm90_ptxas import ptxas_usage
from mla_func.kernels.attention import decode as md
from mla_func.kernels.attention import merge as mm

TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32",
         torch.float8_e4m3fn: "*fp8e4nv"}
LAST_PTX = [""]
LAST_TTGIR = [""]

def compile_sm90(kernel, args, kwargs):
    # As a launch specialises: 16-byte aligned pointers and multiples of 16 get the
    # divisibility hint (without it nothing is pipelined); other ints equal to 1 are constants.
    names = kernel.arg_names
    keep = {names[i] if isinstance(i, int) else i for i in kernel.do_not_specialize or ()}
    opts = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "launch_pdl") if k in kwargs}
    sig, attrs, const = {}, {}, dict(kwargs)
    for i, (name, v) in enumerate(zip(names, args)):
        if torch.is_tensor(v):
            sig[name], div = TYPES[v.dtype], v.data_ptr() % 16 == 0
        elif isinstance(v, int):
            if v == 1 and name not in keep:
                const[name] = 1
            sig[name], div = "i32", v % 16 == 0 and name not in keep
        else:
            sig[name], div = "fp32", False
        if div:
            attrs[(i,)] = [["tt.divisibility", 16]]
    sig = {n: "constexpr" if n in const else sig[n] for n in names}
    k = triton.compile(triton.compiler.ASTSource(kernel, sig, const, attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    regs, spills, _ = ptxas_usage(k)
    LAST_PTX[0] = k.asm["ptx"]
    ttgir = LAST_TTGIR[0] = k.asm["ttgir"]
    buffers = re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x\d+x512", ttgir)
    warps = set(re.findall(r"nvidia_mma<\{[^}]*warpsPerCTA = \[(\d+), (\d+)\]", ttgir))
    return regs, spills, k.metadata.shared, int(buffers[0]) if buffers else 0, warps

def tensors(heads, rows, ctx, page, splits):
    bf, i32 = torch.bfloat16, torch.int32
    return (torch.empty(heads, rows, 512, dtype=bf), torch.empty(rows, heads, 64, dtype=bf),
            torch.empty(rows * ctx // page + 1, page, 576, dtype=bf),
            torch.empty(rows, ctx // page, dtype=i32), torch.empty(rows, dtype=i32),
            torch.empty(rows, dtype=i32), 0.07, torch.empty(heads, rows, 512, dtype=bf),
            torch.empty(rows, heads, splits, 512), torch.empty(rows, heads, splits))

# (heads, page, plan fields, spill-free, KV buffers: 2 = the next tile loads during this one)
for heads, page, fields, clean, buffers in [
        (16, 64, {}, True, None),
        (16, 64, dict(num_stages=3, early=False), True, 2),
        (16, 64, dict(num_stages=3, early=True), True, 2),
        (16, 1, dict(num_stages=3, early=True), True, 2),
        (16, 16, dict(num_stages=3, early=False), True, 2),
        (128, 64, dict(shared_p=False), False, None),
        (128, 64, dict(shared_p=True), True, 2),
        (128, 64, dict(shared_p=True, early=True), True, 2),
        (128, 1, dict(shared_p=True), False, 2)]:  # per-key gather: 100 B spilled
    plan = replace(md.plan_decode(32, 4096, 132, heads), num_splits=4, **fields)
    args = tensors(heads, 32, 4096, page, 4)
    scratch = (torch.empty(32 * 2 * 4 * 2 * 64 * plan.block_n, dtype=torch.bfloat16),
               torch.empty(32 * 2 * 4 * 2 * 64))
    kernel, _, call, kwargs = md.split_launch(*args[:7], plan, *args[7:], scratch)
    kwargs["PDL"] = True  # split_launch turns it off off CUDA (4 splits: a merge follows)
    kwargs["ASM_SYNC"] = True  # split_launch picks the interpreter's barrier off CUDA
    if plan.early:  # split_launch turns it off off CUDA
        kwargs.update(md.early_launch(plan, args[2]))
        assert kwargs["L2_KEYS"] == plan.num_warps * 32
    else:  # the kernel's defaults, as constants
        kwargs.update(EARLY=False, L2_KEYS=0, ROW_BYTES=0)
    regs, spills, smem, bufs, warps = compile_sm90(kernel, call, kwargs)
    ptx = LAST_PTX[0]
    # Early: the L2 prefetch, then the wait, before the first load of q_lat.
    assert ("cp.async.bulk.prefetch.L2.global" in ptx) == plan.early
    assert ("griddepcontrol.wait" in ptx) == plan.early
    print("split", heads, page, fields, "regs", regs, "spills", spills, "smem", smem, bufs,
          "mma warps", warps)
    assert spills == 0 or not clean
    assert buffers is None or bufs == buffers
    assert smem <= 232448  # sm90's shared memory per block
    if plan.shared_p:  # no dot with every warp along its 64 rows: no duplicated score tile
        assert plan.block_n == 64 and warps == {("4", "2")}, warps
# The FP8 cache (656-byte rows): at 16 heads the plan's decode_fp8.py kernel (32-key tiles in
# 3 stages, float16 products at 32 rows: one e4m3 conversion a value pair), at 128 heads the
# dequantising form of the split kernel (64 heads a program).
TYPES[torch.uint8] = "*u8"
for heads, group_scores in ((16, True), (128, False)):
    plan = replace(md.plan_decode(32, 4096, 132, heads, fp8=True), num_splits=4)
    args = list(tensors(heads, 32, 4096, 64, 4))
    args[2] = torch.empty(32 * 4096 // 64 + 1, 64, 656, dtype=torch.uint8)
    scratch = (torch.empty(32 * 2 * 4 * 2 * 64 * plan.block_n, dtype=torch.bfloat16),
               torch.empty(32 * 2 * 4 * 2 * 64))
    kernel, _, call, kwargs = md.split_launch(*args[:7], plan, *args[7:], scratch)
    kwargs.update(PDL=True, **md.early_launch(plan, args[2]))
    if not group_scores:
        kwargs["ASM_SYNC"] = True
    regs, spills, smem, bufs, _ = compile_sm90(kernel, call, kwargs)
    print("split fp8", heads, plan, "regs", regs, "spills", spills, "smem", smem, bufs)
    assert plan.group_scores == group_scores
    assert (kernel is md.split_fp8_kernel) == group_scores
    # decode_fp8.py's kernel at 255 registers: spill-free under Triton 3.6 (the GPU's), 12
    # bytes spilled under 3.9
    assert spills <= (32 if group_scores else 0) and smem <= 232448
    assert "cvt.rn.f16x2.e4m3x2" in LAST_PTX[0]
    # float16 products (bf16 queries): one conversion a value pair, none after it
    assert plan.f16 == group_scores
    assert not plan.f16 or "cvt.bf16.f16" not in LAST_PTX[0]
    if group_scores:  # each group's e4m3 tile streamed into two shared buffers, twice over
        for shape in ("2x32x128xi8", "2x128x32xi8"):
            assert LAST_TTGIR[0].count(f"local_alloc : () -> !ttg.memdesc<{shape}") == 4
# 32 and 128 splits (all in one tile), not launched early; W_UV warmed in L2 before the wait
for splits, pdl, warm in ((32, True, False), (128, False, False), (32, True, True)):
    mc = mm.merge_cols(512, splits)
    po, pl = torch.empty(8, 16, splits, 512), torch.empty(8, 16, splits)
    out = torch.empty(16, 8, 512, dtype=torch.bfloat16)
    pos = torch.empty(8, dtype=torch.int32)
    w_uv = torch.empty(16, 128, 512, dtype=torch.bfloat16)
    regs, spills, _, _, _ = compile_sm90(mm._merge_kernel,
                                         (po, pl, pos, out, w_uv, w_uv.numel() * 2, 4096, 512,
                                          16, 512, splits),
                                         dict(MERGE_C=mc, SPLITS_P2=splits, PDL=pdl,
                                              launch_pdl=pdl, BLOCK_N=32, ACTIVE=pdl, WARM=warm,
                                              num_warps=4))
    print("merge", splits, mc, warm, "regs", regs, "spills", spills)
    assert spills == 0
    assert ("cp.async.bulk.prefetch.L2.global" in LAST_PTX[0]) == warm
from mla_func.kernels.attention import absorb as ab
from mla_func.fp8 import Fp8Weight
bf = torch.bfloat16

def weight(heads, rows, w8):  # W_UK / W_UV: bf16, or block FP8 as V2-Lite's checkpoint holds it
    if not w8:
        return torch.empty(heads, rows, 512, dtype=bf)
    return Fp8Weight(torch.empty(heads, rows, 512, dtype=torch.float8_e4m3fn),
                     torch.empty(heads, 1, 4), (128, 128), (heads, rows, 512))

# one token block; several; one with block-FP8 W_UK
for heads, rows, w8 in ((16, 1, False), (128, 300, False), (16, 1, True)):
    q = torch.empty(rows, heads, 192, dtype=bf)  # q_nope, q_pe: slices of q, as the model's
    new = ab.NewRows(q[..., 128:], torch.empty(rows, 3648, dtype=bf)[:, -576:],
                     torch.empty(rows, dtype=torch.int32), torch.empty(rows, dtype=torch.int32),
                     torch.empty(512, dtype=bf), torch.empty(64), 1.0, 1e-6)
    _, call, kwargs = ab.absorb_launch(
        q[..., :128], weight(heads, 128, w8),
        torch.empty(heads, rows, 512, dtype=bf), torch.empty(100, 64, 576, dtype=bf), new,
        torch.empty(rows, heads, 64, dtype=bf))
    kwargs["PDL"] = True  # absorb_launch turns it off off CUDA: the split may launch early
    regs, spills, smem, _, _ = compile_sm90(ab._absorb_prologue_kernel, call, kwargs)
    assert "griddepcontrol.launch_dependents" in LAST_PTX[0]
    print("absorb", heads, rows, w8, "regs", regs, "spills", spills, "smem", smem)
    assert spills == 0
from mla_func.kernels.attention import merge_uv as uv
for rows, splits, pdl, w8 in ((1, 32, True, False), (8, 29, True, False),
                              (2, 128, False, False), (1, 32, True, True)):
    po, pl = torch.empty(rows, 16, splits, 512), torch.empty(rows, 16, splits)
    w_uv = weight(16, 128, w8)
    out = torch.empty(rows, 16, 128, dtype=torch.bfloat16)
    shares = torch.empty(uv.shares_numel(rows, 16, 512, 128))
    _, call, kwargs = uv.merge_uv_launch(po, pl, torch.empty(rows, dtype=torch.int32), w_uv, out,
                                         32, pdl, shares, torch.zeros(rows * 16, dtype=torch.int32))
    regs, spills, smem, _, _ = compile_sm90(uv._merge_uv_kernel, call, kwargs)
    print("merge_uv", rows, splits, pdl, w8, "regs", regs, "spills", spills, "smem", smem)
    assert spills == 0
    assert ("griddepcontrol.wait" in LAST_PTX[0]) == pdl
    if pdl:  # the W_UV rows are loaded before the wait; the projection after may launch
        ptx = LAST_PTX[0]
        assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait")
    assert ("griddepcontrol.launch_dependents" in LAST_PTX[0]) == pdl
from mla_func.kernels.linear import proj_norm as pn
for rows in (1, 4):  # the output projection + add + norm after it, V2-Lite sizes
    bf = torch.bfloat16
    o, w = torch.empty(rows, 2048, dtype=bf), torch.empty(2048, 2048, dtype=bf)
    h, nw = torch.empty(rows, 2048, dtype=bf), torch.empty(2048, dtype=bf)
    _, call, kwargs, _ = pn.launch(o, w, h, nw, 1e-6)
    kwargs["PDL"] = True  # pdl_supported() is False on a machine without a GPU
    regs, spills, smem, _, _ = compile_sm90(pn._proj_add_norm_kernel, call, kwargs)
    print("proj_norm", rows, "regs", regs, "spills", spills, "smem", smem)
    assert spills == 0
    ptx = LAST_PTX[0]  # the weight rows are loaded before the wait
    assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait")
from mla_func.kernels.linear import small_linear as sl
for rows, n_in in ((1, 2048), (1, 7168)):  # V2-Lite's and V3's fused q + kv_a
    x, w = torch.empty(rows, n_in, dtype=bf), torch.empty(2112, n_in, dtype=bf)
    _, call, kwargs, _ = sl.launch(x, w)
    kwargs["PDL"] = True
    regs, spills, smem, _, _ = compile_sm90(sl._linear_kernel, call, kwargs)
    print("small_linear", rows, n_in, "regs", regs, "spills", spills, "smem", smem)
    assert spills == 0
    ptx = LAST_PTX[0]
    assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait")
from mla_func.kernels.linear import norm_linear as nl
h, nw = torch.empty(1, 2048, dtype=bf), torch.empty(2048, dtype=bf)  # V2-Lite's q + kv_a,
_, call, kwargs, _ = nl.launch(h, nw, 1e-6, torch.empty(3648, 2048, dtype=bf))  # normalising
kwargs["PDL"] = True
regs, spills, smem, _, _ = compile_sm90(nl._norm_linear_kernel, call, kwargs)
print("norm_linear regs", regs, "spills", spills, "smem", smem)
# Within 72 registers a thread 7 programs of 4 warps fit an SM: V2-Lite's 912 at once.
assert spills == 0 and regs <= 72
ptx = LAST_PTX[0]
assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait")
"""


def test_decode_compiles_for_sm90():
    """Ahead-of-time sm90 compile at V2-Lite / V3 sizes (no GPU needed): the variants compile,
    the 16-head ones without spills, and the page entries loaded one tile ahead let the
    pipeliner double-buffer the KV tile at 3 stages.
    shared_p at 128 heads: spill-free at page 64, still double-buffered (the scratch reload and its
    barrier do not stop the pipeliner), and every dot splits over the two warpgroups. The fused
    absorb + prologue compiles spill-free at 16 and 128 heads, and with a block-FP8 W_UK;
    so does the merge fused with W_UV (bf16 or block FP8), which loads its W_UV rows before
    it waits when launched as a dependent and lets the output projection after it launch at
    once; that projection (proj_norm) compiles spill-free and loads its weight rows before
    it waits, as do small_linear and norm_linear.
    The FP8 cache's split kernels compile at their plans' tiles: decode_fp8.py's at 16 heads
    (its e4m3 tiles loaded ahead into shared memory), the dequantising form at 128."""
    out = run_compile_script(_SM90, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
