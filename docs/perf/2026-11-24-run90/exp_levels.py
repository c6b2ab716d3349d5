"""Upper bounds of two ideas for the one-row decode step (2026-11-24, eighteenth session),
measured by taking dependent levels out of the V2-Lite whole-step graph. The variants compute
wrong numbers on purpose (their timings only bound what the real change could gain):

  tree  the working tree.
  noPN  `proj_norm` without its last-program level (add + norm): each program stores its
        projection columns as h and as the normalised row. Bounds "the router and the
        experts normalise the row themselves".
  noLS  the MoE's `last_sum` without its norm level: the last program of an N-tile stores
        h's columns as the next layer's input too. Bounds "the q + kv_a projection
        normalises the row itself" (one token only: last_sum runs at one token).
  noR   no router launch: fixed ids / weights (6 distinct random experts a layer). Bounds
        any change that folds the router into the launch before or after it.
  noPNLS  noPN and noLS.

Then the router alone (`router._launch`) at 1, 128 and 4096 tokens: the tree's two TF32
products against one bf16 product (exact for a router whose values are bf16: random init and
bf16 checkpoints), hidden steps of 32 / 64 / 128.

    PYTHONPATH=. python3 exp_levels.py [--batch 1 4] [--ctx 1024 4096] [--rounds 6]
"""

import argparse
import importlib
import math
import statistics
import sys
from pathlib import Path
from typing import no_type_check

import torch
import triton
import triton.language as tl

import mla_func as mf
import mla_func.kernels.fused_moe as fused_moe
import mla_func.kernels.proj_norm as proj_norm
import mla_func.model as model
from mla_func.kernels.small_linear import project_rows
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

KERNELS = Path("mla_func/kernels")
TMP = Path("/tmp/exp_levels")
TMP.mkdir(exist_ok=True)
sys.path.insert(0, str(TMP))


def variant_module(name: str, src: str, edits: list[tuple[str, str]]):
    text = (KERNELS / src).read_text()
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"{src}: edit not found once: {old[:60]!r}")
        text = text.replace(old, new)
    (TMP / f"{name}.py").write_text(text)
    return importlib.import_module(name)


# noLS: last_sum stores h as y too and skips the norm level.
variant_module("exp_moe_sum", "moe_sum.py", [
    ("                _add_residual(acc, res_ptr, out_ptr, t, offs, ok, n_hidden)\n",
     "                hh = _add_residual(acc, res_ptr, out_ptr, t, offs, ok, n_hidden)\n"
     "                tl.store(y_ptr + t * n_hidden + offs, hh.to(y_ptr.dtype.element_ty),"
     " mask=ok)\n"),
    ("            if last_to_arrive(counter_ptr + n_n, n_n):", "            if False:"),
])
exp_gemm = variant_module("exp_moe_gemm", "moe_gemm.py", [
    ("from mla_func.kernels.moe_sum import last_sum", "from exp_moe_sum import last_sum")])


@triton.jit(do_not_specialize=["n_rows"])
@no_type_check
def _pn_no_last(o_ptr, w_ptr, h_ptr, nw_ptr, a_ptr, h_out_ptr, y_ptr, counter, n_rows, n_in,
                n_out, so, sw, eps, ROWS_P2: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_OUT: tl.constexpr, PDL: tl.constexpr):
    acc, n = project_rows(o_ptr, w_ptr, n_rows, n_in, n_out, so, sw, ROWS_P2, BLOCK_N,
                          BLOCK_K, PDL)
    r = tl.arange(0, ROWS_P2)
    ok = (r < n_rows)[:, None] & (n < n_out)[None, :]
    at = r[:, None] * n_out + n[None, :]
    tl.store(h_out_ptr + at, acc.to(h_out_ptr.dtype.element_ty), mask=ok)
    tl.store(y_ptr + at, acc.to(y_ptr.dtype.element_ty), mask=ok)


TREE = dict(pn=proj_norm._proj_add_norm_kernel, down=fused_moe.down_kernel,
            route=model.route_fused)
FIXED: list = []


def fixed_route(x, router, score_bias, cfg):
    fixed_route.i = (fixed_route.i + 1) % len(FIXED)
    return FIXED[fixed_route.i]


fixed_route.i = -1
VARIANTS = {
    "tree": {},
    "noPN": dict(pn=_pn_no_last),
    "noLS": dict(down=exp_gemm.down_kernel),
    "noR": dict(route=fixed_route),
    "noPNLS": dict(pn=_pn_no_last, down=exp_gemm.down_kernel),
}


def apply(parts: dict) -> None:
    parts = {**TREE, **parts}
    proj_norm._proj_add_norm_kernel = parts["pn"]
    fused_moe.down_kernel = parts["down"]
    model.route_fused = parts["route"]


def capture(params, state, batch, variant: str):
    apply(VARIANTS[variant])
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                mf.forward(params, state, batch)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            mf.forward(params, state, batch)
    finally:
        apply({})
    g.replay()
    torch.cuda.synchronize()
    return g


def steps(args, cfg, params) -> None:
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    for ctx in args.ctx:
        for bsz in args.batch:
            g = torch.Generator().manual_seed(bsz)
            FIXED.clear()
            for _ in range(cfg.num_hidden_layers):
                ids = torch.stack([torch.randperm(cfg.n_routed_experts, generator=g)[:6]
                                   for _ in range(bsz)])
                FIXED.append((torch.full((bsz, 6), 1 / 6, device="cuda"), ids.cuda()))
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
            names = [v for v in VARIANTS if bsz == 1 or "LS" not in v]
            graphs = {v: capture(params, state, batch, v) for v in names}
            times: dict[str, list[float]] = {v: [] for v in names}
            back: dict[str, list[float]] = {v: [] for v in names}
            for r in range(args.rounds):
                for v in (names if r % 2 == 0 else names[::-1]):
                    times[v].append(cuda_time_ms(graphs[v].replay, reps=30))
                    back[v].append(pipelined_ms(graphs[v].replay))
            print(f"ctx {ctx} B={bsz}, ms synced / back to back (synced rounds)", flush=True)
            for v in names:
                print(f"  {v:7s} {statistics.median(times[v]):.3f} / "
                      f"{statistics.median(back[v]):.3f} ({min(times[v]):.3f}-"
                      f"{max(times[v]):.3f})", flush=True)
            del graphs


def router_variant(name: str, block_h: int, bf16: bool):
    src = (KERNELS / "router.py").read_text()
    src = src[:src.index("@functools.lru_cache(maxsize=64)\ndef _reference_cfg")]
    edits = [("_BLOCK_H = 32", f"_BLOCK_H = {block_h}")]
    if bf16:
        edits.append((
            "            w_hi = (wt.to(tl.int32, bitcast=True) & -8192).to(tl.float32, "
            "bitcast=True)\n"
            "            acc = tl.dot(xt.to(tl.float32), wt - w_hi, acc, input_precision=\"tf32\")\n"
            "            acc = tl.dot(xt.to(tl.float32), w_hi, acc, input_precision=\"tf32\")\n",
            "            acc = tl.dot(xt, wt.to(xt.dtype), acc)\n"))
    for old, new in edits:
        if src.count(old) != 1:
            raise SystemExit(f"router.py: edit not found once: {old[:60]!r}")
        src = src.replace(old, new)
    (TMP / f"{name}.py").write_text(src)
    return importlib.import_module(name)


def routers(args, cfg, params) -> None:
    router = params.layers[1].mlp.router
    print(f"router: bf16-exact {torch.equal(router, router.bfloat16().float())}")
    mods = {"tf32x2 h32": router_variant("exp_r_t32", 32, False),
            "bf16 h32": router_variant("exp_r_b32", 32, True),
            "bf16 h64": router_variant("exp_r_b64", 64, True),
            "bf16 h128": router_variant("exp_r_b128", 128, True)}
    for tokens in args.tokens:
        x = torch.randn(tokens, cfg.hidden_size, device="cuda").bfloat16()

        def call(m):
            return m._launch(x, router, None, 6, 1, 1, "greedy", False, 1.0)

        ref = call(mods["tf32x2 h32"])
        graphs, times = {}, {}
        for k, m in mods.items():
            w, i = call(m)
            same = torch.equal(i, ref[1])
            print(f"  {tokens} tokens {k}: ids equal {same}, weights max diff "
                  f"{(w - ref[0]).abs().max().item():.3g}, split {m.launch_config(tokens, 64, 2048)}",
                  flush=True)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(20):
                    call(m)
            graphs[k], times[k] = g, []
        for r in range(args.rounds):
            for k in (list(mods) if r % 2 == 0 else list(mods)[::-1]):
                times[k].append(cuda_time_ms(graphs[k].replay, reps=20) * 1000 / 20)
        print(f"router alone, {tokens} tokens, us a launch (20 a graph), median (rounds)")
        for k in mods:
            print(f"  {k:10s} {statistics.median(times[k]):7.2f} ({min(times[k]):.2f}-"
                  f"{max(times[k]):.2f})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 128, 4096])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--parts", nargs="+", default=["steps", "routers"])
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    print(f"# {torch.cuda.get_device_name()}")
    if "routers" in args.parts:
        routers(args, cfg, params)
    if "steps" in args.parts:
        steps(args, cfg, params)


if __name__ == "__main__":
    main()
