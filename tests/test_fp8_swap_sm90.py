"""Ahead-of-time sm90 compiles (no GPU needed) of the block-FP8 expert GEMMs' 16-row tiles:
the swapped product (`kernels.swap_ab`) is an e4m3 warp-group MMA fed from shared memory,
with no e4m3 conversion in the kernel, where the unswapped order (a weight tile under the
warp-group MMA's 64 rows) converts every weight to float16 for the warp-level MMA; at the
FP8 table's 1- and 128-token rows."""

from sm90_ptxas import run_compile_script

_SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from mla_func.kernels.moe.config import pick_config
from mla_func.kernels.moe.down import down_kernel
from mla_func.kernels.moe.gate_up import gate_up_kernel

def compile_ir(fn, const, types, warps, stages):
    sig = {n: "constexpr" if n in const else types.get(n, "*bf16" if n.endswith("_ptr")
           else "i32") for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n][0] == "*" or n.startswith(("stride", "n_inter", "n_hidden"))}
    k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const,
                                                 attrs=attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=stages))
    return k.asm["ttgir"], k.asm["ptx"]

moe_types = dict(weights_ptr="*fp32", ids_ptr="*i64", sorted_ptr="*i32",
                 block_expert_ptr="*i32", block_rows_ptr="*i32", counter_ptr="*i32",
                 eps="fp32", q_ptr="*fp32", qs_ptr="*fp32", w_ptr="*fp8e4nv",
                 ws_ptr="*fp8e4nv", xs_ptr="*fp32", as_ptr="*fp32", part_ptr="*fp32",
                 cnt_ptr="*i32")
cases = []
for tokens, swap in ((1, True), (128, True), (1, False)):
    cfg = pick_config(tokens, fp8=True)
    for fn, (bn, bk, warps, stages) in ((gate_up_kernel, cfg.gate_up), (down_kernel, cfg.down)):
        gate = fn is gate_up_kernel
        # unswapped: a 32-column weight tile, under the warp-group MMA's 64 rows
        const = dict(PAIRS_PER_TOKEN=8, BLOCK_M=16, BLOCK_N=bn if swap else 32, BLOCK_K=bk,
                     PRECISION="tf32", EVEN_K=True, FP8=True, ROUND=False,
                     DIRECT=cfg.direct, TMA=False, MERGE_TAIL=False, LOCAL=False, w_desc=None)
        types = dict(moe_types)
        if gate:
            const.update(PDL=True, INLINE=cfg.inline_align, E_P2=128 if cfg.inline_align else 2,
                         P_BLOCK=256 if cfg.inline_align else 1, XQ=cfg.quant_x,
                         SPLIT=cfg.gate_up_split)
            types["x_ptr"] = "*fp8e4nv" if cfg.quant_x else "*bf16"
        else:
            const.update(LAST_SUM=False, HAS_EXTRA=False, ADD_NORM=False, TRIGGER=False,
                         SUM_BLOCK=1, AQ=cfg.quant_act, act_desc=None, act_tail_desc=None,
                         SPLIT=cfg.down_split)
            types["act_ptr"] = "*fp8e4nv" if cfg.quant_act else "*bf16"
        cases.append((f"{fn.__name__} {tokens} tokens", swap,
                      compile_ir(fn, const, types, warps, stages)))
bad = []
for name, swap, (ttgir, ptx) in cases:
    wgmma = "warp_group_dot " in ttgir and "wgmma.mma_async.sync.aligned" in ptx
    e4m3_wgmma = ".e4m3.e4m3" in ptx
    converts = "cvt.rn.f16x2.e4m3x2" in ptx
    print(name, "swap" if swap else "plain", wgmma, e4m3_wgmma, converts)
    if (wgmma and e4m3_wgmma and not converts) != swap:
        bad.append(name)
assert not bad, bad
"""


def test_few_row_fp8_tiles_feed_e4m3_to_warp_group_mmas():
    out = run_compile_script(_SCRIPT, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
