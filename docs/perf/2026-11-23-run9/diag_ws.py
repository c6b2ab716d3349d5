"""Which part of the warp-specialised MoE path hangs (run 9): each case in its own process
with a time limit. Cases: `gather`, `gate_up` (gather + warp-specialised gate_up), `down`
(pointer-load gate_up, then the warp-specialised down), `full`, at the token count given.

Needs the reverted attempt back first (`git apply docs/perf/2026-11-23-run9/ws_attempt.patch`):
both warp-specialised kernels hung on the H100 (runs 9-10), so the code is not in the tree.

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run9/diag_ws.py
"""

import subprocess
import sys
import time

import torch

CASE = """
import sys, torch, triton
from mla_func.kernels import fused_moe
from mla_func.kernels.fused_moe import _desc, _gate_up_ws, fused_experts
from mla_func.kernels.moe_align import align
from mla_func.kernels.moe_config import MoEConfig
from mla_func.kernels.moe_gemm_ws import down_ws_kernel, gather_rows_kernel
sys.path.insert(0, "tests")
from test_moe import V2_LITE, make
case, tokens, warps, stages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
x, w, ids, gu, dn, mlp = make(tokens, **V2_LITE, dtype=torch.bfloat16, device="cuda")
layout = align(ids, 64, 0, 128, False)
n_tiles = layout[1].shape[0]
common = dict(PAIRS_PER_TOKEN=6, BLOCK_M=128, PRECISION="tf32")
act = torch.zeros(n_tiles * 128, 1408, dtype=x.dtype, device="cuda")
if case == "gather":
    xs = torch.empty(n_tiles * 128, 2048, dtype=x.dtype, device="cuda")
    gather_rows_kernel[(n_tiles, 16)](x, xs, layout[0], layout[2], 2048, x.stride(0),
                                      PAIRS_PER_TOKEN=6, BLOCK_M=128, BLOCK_K=128, num_warps=4)
elif case == "gate_up":
    _gate_up_ws(x, gu, act, layout, 128, 64, 64, warps, stages, False, common)
elif case == "down":
    buf = torch.empty(tokens * 6, 2048, dtype=x.dtype, device="cuda")
    down_ws_kernel[(8, n_tiles)](_desc(act, [128, 64]), _desc(dn, [256, 64]), buf, w, *layout,
                                 6, 2048, 1408, BLOCK_N=256, BLOCK_K=64, **common,
                                 num_warps=warps, num_stages=stages)
else:
    cfg = MoEConfig(128, (64, 64, warps, stages), (256, 64, warps, stages), fuse_shared=False,
                    tma=True, warp_spec=True)
    fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg)
torch.cuda.synchronize()
print("ok", case, tokens, warps, stages, "tiles", n_tiles)
"""

for case, tokens, warps, stages in [("gather", 300, 4, 3), ("down", 300, 4, 3),
                                    ("gate_up", 300, 4, 3), ("down", 4096, 4, 3),
                                    ("gate_up", 4096, 4, 3), ("full", 4096, 4, 3)]:
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", CASE, case, str(tokens), str(warps),
                              str(stages)], capture_output=True, text=True, timeout=60)
        msg = (out.stdout + out.stderr).strip().splitlines()[-1:] or ["(no output)"]
    except subprocess.TimeoutExpired:
        msg = ["HANG (60 s)"]
    print(f"{case:8} {tokens:5} w{warps} s{stages}: {msg[0][:200]} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
del torch
