"""The 4096-token MoE GEMMs with their output stored through TMA, in aligned row order, and
the pair sum reading each pair's row through `pos` (2026-11-24, eleventh session).

The Gluon kernels of 2026-11-23 (run 22) were ~20% faster with a TMA-store epilogue than
with pointer stores, and the pointer-store form timed like the tree's Triton kernels. This
asks whether Triton, with the same epilogue (and optionally a persistent grid), gains too.

Variants (whole 128-row tiles, TMA loads, shared experts apart, in every one):
  cur      the tree's kernels (pointer stores; down writes each pair's row), whole tiles
  halves   the tree's 4096-token config (half tiles)
  store    TMA-store epilogues (act, and down's rows in aligned order), one tile a program
  persist  the same kernels over a persistent grid (one program per SM, tiles strided)
  flat     persistent, the tile and K loops flattened (`tl.range(..., flatten=True)`)

    PYTHONPATH=. python3 exp_moe_store.py [--tokens 4096] [--rounds 5]
"""

import argparse
import statistics

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from mla_func.config import MLAConfig
from mla_func.kernels.fused_moe import fused_experts
from mla_func.kernels.moe_align import align
from mla_func.kernels.moe_config import MoEConfig, pick_config
from mla_func.kernels.moe_gemm import _pair_sum  # noqa: F401  (same sum order, see sum_pos)
from mla_func.kernels.router import route_fused
from mla_func.kernels.swiglu import swiglu
from scripts.bench_common import graph_time_ms, measure_ceilings
from scripts.bench_moe import floor_us, make_layers


@triton.jit
def gate_up_store(x_ptr, w_desc, act_desc, sorted_ptr, block_expert_ptr, block_rows_ptr,
                  n_tiles, n_inter, n_hidden, stride_x, PAIRS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  FLATTEN: tl.constexpr):
    n_n = tl.cdiv(n_inter, BLOCK_N)
    for tid in tl.range(tl.program_id(0), n_tiles * n_n, tl.num_programs(0), flatten=FLATTEN):
        pid_n = tid % n_n
        pid_m = tid // n_n
        e = tl.load(block_expert_ptr + pid_m)
        if e >= 0:
            rows = tl.arange(0, BLOCK_M)
            row_ok = rows < tl.load(block_rows_ptr + pid_m)
            pair = tl.load(sorted_ptr + pid_m * BLOCK_M + rows, mask=row_ok, other=0)
            tok = (pair // PAIRS).to(tl.int64)
            offs_k = tl.arange(0, BLOCK_K)
            a_ptrs = x_ptr + tok[:, None] * stride_x + offs_k[None, :]
            acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
            for k in range(0, n_hidden, BLOCK_K):
                a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
                b = w_desc.load([e, 0, pid_n * BLOCK_N, k]).reshape(2 * BLOCK_N, BLOCK_K)
                acc = tl.dot(a, tl.trans(b), acc)
                a_ptrs += BLOCK_K
            g, u = tl.split(tl.permute(acc.reshape(BLOCK_M, 2, BLOCK_N), (0, 2, 1)))
            act = g * tl.sigmoid(g) * u
            act_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], act.to(x_ptr.dtype.element_ty))


@triton.jit
def down_store(act_desc, w_desc, out_desc, weights_ptr, sorted_ptr, block_expert_ptr,
               block_rows_ptr, n_tiles, n_hidden, n_inter, topk, PAIRS: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               FLATTEN: tl.constexpr, SUBTILE: tl.constexpr, DT: tl.constexpr):
    n_n = tl.cdiv(n_hidden, BLOCK_N)
    for tid in tl.range(tl.program_id(0), n_tiles * n_n, tl.num_programs(0), flatten=FLATTEN):
        pid_n = tid % n_n
        pid_m = tid // n_n
        e = tl.load(block_expert_ptr + pid_m)
        if e >= 0:
            row_w = e * n_hidden + pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(0, n_inter, BLOCK_K):
                a = act_desc.load([pid_m * BLOCK_M, k])
                b = tl.trans(w_desc.load([row_w, k]))
                acc = tl.dot(a, b, acc)
            rows = tl.arange(0, BLOCK_M)
            row_ok = rows < tl.load(block_rows_ptr + pid_m)
            pair = tl.load(sorted_ptr + pid_m * BLOCK_M + rows, mask=row_ok, other=0)
            w = tl.load(weights_ptr + (pair // PAIRS) * topk + pair % PAIRS, mask=row_ok,
                        other=1.0)
            y = (acc.to(DT).to(tl.float32) * w[:, None]).to(DT)
            if SUBTILE:  # two [BLOCK_M, BLOCK_N / 2] stores: half the epilogue's smem
                y0, y1 = tl.split(tl.permute(y.reshape(BLOCK_M, 2, BLOCK_N // 2), (0, 2, 1)))
                out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], y0)
                out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], y1)
            else:
                out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], y)


@triton.jit
def sum_pos(buf_ptr, pos_ptr, extra_ptr, out_ptr, n_hidden, PAIRS: tl.constexpr,
            BLOCK: tl.constexpr):
    """out[t] = extra[t] + the pair rows of token t (found through pos), in fp32, in the tree
    sum's order."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n_hidden
    acc = tl.load(extra_ptr + t * n_hidden + offs, mask=ok, other=0.0).to(tl.float32)
    for j in tl.static_range(PAIRS):
        row = tl.load(pos_ptr + t * PAIRS + j).to(tl.int64)
        acc += tl.load(buf_ptr + row * n_hidden + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * n_hidden + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


WHOLE = MoEConfig(128, (128, 64, 8, 4), (256, 64, 8, 4), fuse_shared=False, pdl=True, tma=True)


def store_experts(x, w, ids, gate_up, down, shared, variant, down_stages=4, subtile=False):
    """The routed experts (+ the shared ones apart) with TMA-store epilogues."""
    tokens, topk = ids.shape
    n_routed, _, n_inter, n_hidden = gate_up.shape
    extra = swiglu(x, *shared)
    bm, (bn, bk, warps, stages) = 128, WHOLE.gate_up
    sorted_pairs, block_expert, block_rows = align(ids, n_routed, 0, bm, False)
    n_tiles = block_expert.shape[0]
    rows = n_tiles * bm
    act = torch.empty(rows, n_inter, dtype=x.dtype, device=x.device)
    sms = (torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda
           else 3)
    persist = variant in ("persist", "flat")
    flat = variant == "flat"
    n_n = triton.cdiv(n_inter, bn)
    gate_up_store[(sms if persist else n_tiles * n_n,)](
        x, TensorDescriptor.from_tensor(gate_up, [1, 2, bn, bk]),
        TensorDescriptor.from_tensor(act, [bm, bn]), sorted_pairs, block_expert, block_rows,
        n_tiles, n_inter, n_hidden, x.stride(0), PAIRS=topk, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=bk, FLATTEN=flat, num_warps=warps, num_stages=stages)
    buf = torch.empty(rows, n_hidden, dtype=x.dtype, device=x.device)
    bn, bk, warps, _ = WHOLE.down
    n_n = triton.cdiv(n_hidden, bn)
    down_store[(sms if persist else n_tiles * n_n,)](
        TensorDescriptor.from_tensor(act, [bm, bk]),
        TensorDescriptor.from_tensor(down.view(-1, n_inter), [bn, bk]),
        TensorDescriptor.from_tensor(buf, [bm, bn // 2 if subtile else bn]), w, sorted_pairs,
        block_expert, block_rows, n_tiles, n_hidden, n_inter, topk, PAIRS=topk, BLOCK_M=bm,
        BLOCK_N=bn, BLOCK_K=bk, FLATTEN=flat, SUBTILE=subtile, DT=tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float32,
        num_warps=warps,
        num_stages=down_stages)
    # pos[pair] = its aligned row (in the tree this would be one more store in the alignment)
    r = torch.arange(rows, device=x.device, dtype=torch.int32)
    real = (r % bm) < block_rows.repeat_interleave(bm)
    pairs = tokens * topk
    pos = torch.empty(pairs + 1, dtype=torch.int32, device=x.device)
    pos.scatter_(0, torch.where(real, sorted_pairs, pairs).long(), r)
    out = torch.empty_like(x)
    sum_pos[(tokens, 2)](buf, pos, extra, out, n_hidden, PAIRS=topk, BLOCK=1024, num_warps=4)
    return out


def layer_fn(variant, cfg):
    def run(x, layer):
        w, ids = route_fused(x, layer.router, None, cfg)
        shared = (layer.shared_gate_up, layer.shared_down)
        if variant in ("cur", "halves"):
            moe = WHOLE if variant == "cur" else pick_config(x.shape[0])
            return fused_experts(x, w, ids, layer.gate_up, layer.down, *shared, moe)
        if variant.startswith("store3"):
            return store_experts(x, w, ids, layer.gate_up, layer.down, shared, "store", 3)
        if variant == "store-sub":
            return store_experts(x, w, ids, layer.gate_up, layer.down, shared, "store",
                                 subtile=True)
        if variant == "persist-sub":
            return store_experts(x, w, ids, layer.gate_up, layer.down, shared, "persist",
                                 subtile=True)
        return store_experts(x, w, ids, layer.gate_up, layer.down, shared, variant)
    return run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[4096])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--variants", nargs="+",
                   default=["cur", "halves", "store", "store-sub", "store3", "persist",
                            "persist-sub", "flat"])
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = MLAConfig.preset("v2-lite")
    ceil = measure_ceilings()
    print(f"copy {ceil['copy_gbs']:.0f} GB/s, matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
    layers = make_layers(cfg, 4)
    for t in args.tokens:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        floor, _ = floor_us(x, layers, cfg, ceil)
        ref = layer_fn("cur", cfg)(x, layers[0])
        fns, ok = {}, []
        for v in args.variants:
            fn = layer_fn(v, cfg)
            try:
                got = fn(x, layers[0])
                torch.cuda.synchronize()
            except Exception as err:  # noqa: BLE001  (a variant that cannot run is reported)
                print(f"  {v}: {type(err).__name__}: {err}"[:400])
                continue
            same = torch.equal(got, ref)
            diff = (got.float() - ref.float()).abs().max().item()
            print(f"  {v}: bit-equal {same}, max |diff| {diff:.3g}")
            fns[v] = fn
        times = {v: [] for v in fns}
        for _ in range(args.rounds):
            for v, fn in fns.items():
                ms = graph_time_ms(lambda fn=fn: [fn(x, layer) for layer in layers], reps=20)
                times[v].append(ms * 1e3 / len(layers))
        print(f"tokens {t}: floor {floor:.1f} us")
        for v in fns:
            med = statistics.median(times[v])
            print(f"  {v:12s} {med:8.1f} us  {med / floor:.3f}x  "
                  f"rounds {' '.join(f'{u:.0f}' for u in times[v])}")


if __name__ == "__main__":
    main()
