"""The V2-Lite MoE layer at large steps, variants side by side in one process (GPU):
  silu:   the shared experts' SiLU*up alone, [tokens, 2816] -> [tokens, 1408], old kernel
          (one program per row and 1024 columns) against the new flat one;
  layer:  scripts.bench_moe's `fused_layer` (4 distinct layers a graph) with the default
          config, and with `shared_stream` toggled;
  prefill: an eager V2-Lite prefill step (one prompt) with the default config and with
          `shared_stream` toggled (every MoE config row from 513 tokens).
Medians of alternating rounds.

    PYTHONPATH=. python3 exp_moe_variants.py [--tokens 4096 8192] [--parts silu layer prefill]
"""

import argparse
import statistics
from dataclasses import replace

import torch
import triton
import triton.language as tl

import mla_func as mf
from mla_func.config import MLAConfig
from mla_func.kernels import moe_config
from mla_func.kernels.swiglu import silu_mul
from scripts.bench_common import cuda_time_ms, graph_time_ms
from scripts.bench_moe import fused_layer, make_layers


@triton.jit
def _old_silu_mul_kernel(gu_ptr, act_ptr, n_inter, stride_gu, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_inter
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + n_inter + cols, mask=ok, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(act_ptr.dtype.element_ty).to(tl.float32)
    tl.store(act_ptr + row * n_inter + cols, (s * u).to(act_ptr.dtype.element_ty), mask=ok)


def old_silu_mul(gu):
    tokens, inter = gu.shape[0], gu.shape[1] // 2
    act = torch.empty(tokens, inter, dtype=gu.dtype, device=gu.device)
    _old_silu_mul_kernel[(tokens, triton.cdiv(inter, 1024))](gu, act, inter, gu.stride(0),
                                                             BLOCK=1024, num_warps=4)
    return act


def rounds(fns: dict, n: int) -> dict[str, float]:
    got: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(n):
        for k in (names if r % 2 == 0 else names[::-1]):
            got[k].append(fns[k]())
    return {k: statistics.median(v) for k, v in got.items()}


def toggled(on: bool) -> tuple:
    return tuple((b, replace(c, shared_stream=on) if b > 512 else c)
                 for b, c in moe_config.CONFIGS)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--parts", nargs="+", default=["silu", "layer", "prefill"])
    args = p.parse_args()
    cfg = MLAConfig.preset("v2-lite")
    default = moe_config.CONFIGS
    print(f"# {torch.cuda.get_device_name()}")
    if "silu" in args.parts:
        for t in args.tokens:
            gu = torch.randn(t, 2816, device="cuda", dtype=torch.bfloat16) * 3
            assert torch.equal(old_silu_mul(gu), silu_mul(gu))
            got = rounds({"old": lambda: graph_time_ms(lambda: old_silu_mul(gu)) * 1e3,
                          "new": lambda: graph_time_ms(lambda: silu_mul(gu)) * 1e3}, 4)
            print(f"silu {t} tokens: old {got['old']:.2f} us, new {got['new']:.2f} us "
                  f"(same bits)", flush=True)
    if "layer" in args.parts:
        layers = make_layers(cfg, 4)
        for t in args.tokens:
            x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
            on = replace(moe_config.pick_config(t), shared_stream=True)
            off = replace(moe_config.pick_config(t), shared_stream=False)

            def layer_us(c):
                return graph_time_ms(lambda: [fused_layer(x, ly, cfg, c) for ly in layers]
                                     ) * 1e3 / len(layers)
            got = rounds({"default": lambda: layer_us(None), "stream_on": lambda: layer_us(on),
                          "stream_off": lambda: layer_us(off)}, 4)
            print(f"layer {t} tokens (default {moe_config.pick_config(t).shared_stream}): "
                  + ", ".join(f"{k} {v:.1f} us" for k, v in got.items()), flush=True)
    if "prefill" in args.parts:
        params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
        state = mf.init_state(cfg, 9000 // 64 + 4, 64, device="cuda", dtype=torch.bfloat16)
        for t in args.tokens:
            alloc = state.allocator
            for seq in list(alloc.pages):
                alloc.release(seq)
            pages = alloc.reserve(0, t)
            toks = torch.randint(0, 100000, (t,)).tolist()
            batch = mf.make_batch([mf.SeqWork(toks, 0, pages)], 64, len(pages),
                                  device="cuda", backend="triton")

            def step_ms(configs):
                moe_config.CONFIGS = configs
                try:
                    return cuda_time_ms(lambda: mf.forward(params, state, batch), reps=5)
                finally:
                    moe_config.CONFIGS = default
            got = rounds({"stream_off": lambda: step_ms(toggled(False)),
                          "stream_on": lambda: step_ms(toggled(True))}, 6)
            print(f"eager prefill {t} tokens: " + ", ".join(f"{k} {v:.2f} ms"
                                                             for k, v in got.items()), flush=True)


if __name__ == "__main__":
    main()
