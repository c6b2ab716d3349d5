"""What bounds the routed expert GEMMs at 4096 tokens: the tensor cores or L2's bandwidth?
(twenty-ninth session, 2026-11-25.)

The routed gate_up at 4096 V2-Lite tokens runs at ~75% of the dense matmul rate, as plain
Triton does on a dense product of the same shape, while cuBLAS (2-CTA clusters, multicast
loads) reaches ~95%. A 128 x 256 product tile loads 16 KB of A and 32 KB of B from L2 per
K step of 64: about 3.3 GB a layer's gate_up, ~7 TB/s at its speed. If L2 is what bounds it,
a program that computes more rows on the weight tiles it loads (the merged tail's 192 rows)
costs less per row; if the tensor cores are, time follows the rows.

Exact, balanced routing, T = 4096 tokens, 64 experts, top-k in {3, 4, 5, 6}: token t picks
experts (t * k + j) mod 64, so every expert gets exactly 64 k rows: 192 (a 128-row tile and
a 64-row tail: one program of 192 rows under `merge_tail`), 256 (two tiles), 320 (a tile, and
a tile with the tail) and 384 (three tiles). The table's 4096-token config (merge_tail on)
and the same with merge_tail off; the routed kernels alone under the profiler (10 calls),
µs a call, against two models: time ~ rows (tensor-bound) and time ~ L2 bytes (A rows read +
B tiles read per program). Then L2's read bandwidth by a plain Triton kernel that sums a
buffer that fits in L2 (and one that does not), all SMs.

    PYTHONPATH=. python3 exp_units.py
"""

from dataclasses import replace

import torch
import triton
import triton.language as tl

from mla_func.config import MLAConfig
from mla_func.kernels.fused_moe import fused_experts
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import cuda_time_ms, measure_ceilings


def profile_kernels(run, calls: int = 10) -> dict[str, float]:
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    per: dict[str, float] = {}
    for ev in prof.key_averages():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.key[:24]] = ev.device_time_total / calls
    return per


@triton.jit
def _l2_read(src, out, n, iters, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    offs = tl.arange(0, BLOCK)
    for i in range(iters):
        start = ((pid + i * nprog) * BLOCK) % n
        acc += tl.load(src + start + offs).to(tl.float32)
    tl.store(out + pid * BLOCK + offs, acc)


def read_bw(nbytes: int, programs: int, iters: int, block: int = 8192, warps: int = 8):
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(programs * block, device="cuda", dtype=torch.float32)
    fn = lambda: _l2_read[(programs,)](src, out, src.numel(), iters, BLOCK=block,  # noqa: E731
                                       num_warps=warps)
    ms = cuda_time_ms(fn, reps=10)
    return programs * iters * block * 2 / (ms * 1e-3) / 1e12


def main() -> None:
    cfg = MLAConfig.preset("v2-lite")
    print(f"# {torch.cuda.get_device_name()}")
    ceil = measure_ceilings()
    print(f"copy {ceil['copy_gbs']:.0f} GB/s, matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    e, hidden, inter, t = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size, 4096
    gate_up = torch.randn(e, 2, inter, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    down = torch.randn(e, hidden, inter, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16)
    table = pick_config(t)
    print(f"config {table}")
    rows = []
    for k in (3, 4, 5, 6):
        tok = torch.arange(t, device="cuda")[:, None]
        ids = ((tok * k + torch.arange(k, device="cuda")[None, :]) % e)
        w = torch.softmax(torch.randn(t, k, device="cuda"), dim=-1)
        for name, c in (("merge_tail", table), ("whole tiles", replace(table, merge_tail=False))):
            if name == "whole tiles" and k in (4, 6):
                continue  # no tails: the same programs
            run = lambda c=c, ids=ids, w=w: fused_experts(x, w, ids, gate_up, down,  # noqa: E731
                                                          config=c)
            ref = fused_experts(x, w, ids, gate_up, down, config=table)
            same = torch.equal(run(), ref)
            per = profile_kernels(run)
            gu = next(v for n, v in per.items() if n.startswith("gate_up"))
            dn = next(v for n, v in per.items() if n.startswith("down"))
            r = 64 * k  # rows an expert
            whole, tail = divmod(r, 128)
            merged = name == "merge_tail" and 0 < tail <= 64 and whole > 0
            programs = whole + (0 if merged or tail == 0 else 1)
            computed = 128 * whole + (64 if merged else 128 if tail else 0)
            # L2 bytes per expert and N-tile (gate_up: A 2 B a row over K, B 32 KB a K step)
            l2 = computed * hidden * 2 + programs * 2 * 128 * hidden * 2
            flops = 2 * t * k * hidden * 2 * inter
            rows.append((k, name, r, programs, computed, l2, gu, dn, flops, same))
    base = next(x for x in rows if x[0] == 4)
    print("\n| top-k | variant | rows an expert | programs an expert | rows computed | "
          "gate_up µs | TFLOP/s | / top-4 | rows model | L2 model | down µs | / top-4 | same bits |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for k, name, r, programs, computed, l2, gu, dn, flops, same in rows:
        print(f"| {k} | {name} | {r} | {programs} | {computed} | {gu:.1f} | "
              f"{flops / gu / 1e6:.0f} | {gu / base[6]:.3f} | {computed / base[4]:.3f} | "
              f"{l2 / base[5]:.3f} | {dn:.1f} | {dn / base[7]:.3f} | {same} |")

    print("\nread bandwidth, TB/s (sum of a buffer by all SMs):")
    for mb in (8, 16, 32, 2048):
        for per_sm in (2, 4):
            bw = read_bw(mb << 20, sms * per_sm, iters=256)
            print(f"  {mb:5d} MB buffer, {per_sm} programs an SM: {bw:.2f}")


if __name__ == "__main__":
    main()
