"""Does Triton's sm90 automatic warp specialisation run here, and with which control flow
(run 10)? One small TMA GEMM per M-tile, with an expert per tile read from memory (-1:
unused tile), in four forms, each in its own process with a time limit:
`plain` (every tile used, no branch), `zero_trip` (unused tiles: loop bound 0),
`if_live` (the body inside `if e >= 0`), `full_k` (unused tiles run the loop on expert 0 and
store nothing). Checked against torch.

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run9/diag_ws2.py
"""

import os
import subprocess
import sys
import tempfile
import time

CASE = r'''
import sys, torch, triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

@triton.jit
def gemm(a_desc, b_desc, c_ptr, e_ptr, N, K, BM: tl.constexpr, BN: tl.constexpr,
         BK: tl.constexpr, MODE: tl.constexpr, WS: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    e = tl.load(e_ptr + pid_m)
    live = e >= 0
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    if MODE == 2:
        if live:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k in tl.range(0, K, BK, warp_specialize=WS):
                a = a_desc.load([pid_m * BM, k])
                b = b_desc.load([e * N + pid_n * BN, k])
                acc = tl.dot(a, b.T, acc)
            tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(tl.bfloat16))
    else:
        if MODE == 1:
            k_end = tl.where(live, K, 0)
        else:
            k_end = K
        ee = tl.maximum(e, 0)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in tl.range(0, k_end, BK, warp_specialize=WS):
            a = a_desc.load([pid_m * BM, k])
            b = b_desc.load([ee * N + pid_n * BN, k])
            acc = tl.dot(a, b.T, acc)
        tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(tl.bfloat16),
                 mask=live & (rows < 1 << 30)[:, None])

mode = dict(plain=0, zero_trip=1, if_live=2, full_k=3)[sys.argv[1]]
ws = sys.argv[2] == "1"
M, N, K, E, BM, BN, BK = 1024, 512, 2048, 4, 128, 128, 64
torch.manual_seed(0)
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(E * N, K, device="cuda", dtype=torch.bfloat16)
e = torch.arange(M // BM, device="cuda", dtype=torch.int32) % E
if mode != 0:
    e[1::3] = -1
c = torch.zeros(M, N, device="cuda", dtype=torch.bfloat16)
gemm[(N // BN, M // BM)](TensorDescriptor.from_tensor(a, [BM, BK]),
                         TensorDescriptor.from_tensor(b, [BN, BK]), c, e, N, K,
                         BM=BM, BN=BN, BK=BK, MODE=mode, WS=ws, num_warps=4, num_stages=3)
torch.cuda.synchronize()
want = torch.zeros_like(c)
for m in range(M // BM):
    if e[m] >= 0:
        want[m * BM:(m + 1) * BM] = (a[m * BM:(m + 1) * BM].float()
                                     @ b[e[m] * N:(e[m] + 1) * N].float().T).bfloat16()
err = ((c.float() - want.float()).abs().max() / want.float().abs().max()).item()
print("ok", sys.argv[1], "ws" if ws else "no-ws", "err", f"{err:.2e}")
'''

# @triton.jit needs its source in a file.
SCRIPT = os.path.join(tempfile.mkdtemp(), "ws_case.py")
with open(SCRIPT, "w") as f:
    f.write(CASE)

for mode in ("plain", "zero_trip", "if_live", "full_k"):
    for ws in ("1", "0"):
        if ws == "0" and mode != "plain":
            continue
        t0 = time.perf_counter()
        try:
            out = subprocess.run([sys.executable, SCRIPT, mode, ws], capture_output=True,
                                 text=True, timeout=40)
            msg = (out.stdout + out.stderr).strip().splitlines()[-1:] or ["(no output)"]
        except subprocess.TimeoutExpired:
            msg = ["HANG (40 s)"]
        print(f"{mode:10} ws={ws}: {msg[0][:200]} ({time.perf_counter() - t0:.0f} s)",
              flush=True)
