"""Benchmark one MoE layer (router + routed experts + shared experts) against its floor and a
`torch._grouped_mm` baseline, all captured in CUDA graphs (GPU only).

Floor = max(bytes / copy bandwidth, FLOPs / bf16 matmul rate) (docs/PERF.md, "Conventions"),
both ceilings measured in this run; bytes = the distinct experts this step's routing touches +
the shared experts + the router + activations. Each graph runs `--layers` distinct layers'
weights back to back (together far beyond L2, as in a real step) and times are per layer.
Each form is captured once and timed in `--rounds` rounds (default 5), the forms in alternating
order; the table gives each form's median and the rounds' range (`spread`).

Three ratios to the floor, which differ only in the matmul rate: `x_floor` at the run's
start-of-run reading (`measure_ceilings`: a short burst, at the boost clock);
`x_floor_sustained` at the rate a dense matmul holds under sustained load
(`common.sustained_matmul`); `x_floor_paired`, each round at the rate probed just before and
after it (`common.matmul_probe`), with the SM clock NVML read after it (`mhz`). Where the
layer is FLOP-bound and draws enough power to lower the clocks, the three part.

Rows per token count: `fused` (route + mla_func.moe.experts: Triton, shared experts folded
in), `fused_sep` (Triton routed experts, shared experts by swiglu), `grouped_mm` (the baseline
of issue 5: argsort, scatter-add counts, cumsum offsets, gather, two grouped GEMMs, index_add,
shared experts), and the two parts of `fused` alone: `route_only` (the fused router) and
`experts_only` (align + two GEMMs + sum; its floor is the same minus the router's bytes);
where the default config launches the experts behind the router by PDL (`MoEConfig.pdl`),
`fused_no_pdl` is the same without it.
`fused` and `route_only` route with the fused Triton router (`kernels/router/route.py`), as
the model does on CUDA; the baseline routes with the torch reference.
`err` is fused vs grouped_mm (max abs / max abs). A table of the alignment alone (Triton
kernel vs torch ops) follows: it decides `moe_align.TRITON_ALIGN_MAX_PAIRS`.

`--sweep` times tile configs per token count (`bench_moe_sweep.py`), every case checked
against grouped_mm, and prints the best next to the default (`moe_config.pick_config`).

`--weights fp8` (`bench_moe_fp8.py`): the experts in block FP8; `fused` and `experts_only` run
the FP8 GEMMs against a floor in FP8 bytes at the FP8 matmul rate of the same run (their
x_floor only: the probes and the sustained rate are bf16's), `fused_bf16` and `grouped_mm` the
same layers' dequantised bf16 weights (their floors as above); `err` is fused against
grouped_mm, the FP8 activations' rounding included.

    python -m scripts.bench moe [--tokens 1 8 ...] [--layers 4] [--sweep] [--weights fp8]
    python -m scripts.bench_moe --sweep --tokens 1 2 4 8 32 128 256 512 4096
"""

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

try:  # `python -m scripts.bench moe` / `python -m scripts.bench_moe`
    from scripts.bench_args import moe as add_args
except ImportError:  # `python scripts/bench_moe.py`
    from bench_args import moe as add_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    add_args(p)
    return p.parse_args(argv)


if __name__ == "__main__":  # --help and a mistyped option answer before torch is imported
    parse_args()

import torch
import torch.nn.functional as F

from mla_func.config import MLAConfig
from mla_func.fp8 import Fp8Weight
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.moe.align import align_torch, align_triton
from mla_func.kernels.moe.config import MoEConfig, pick_config
from mla_func.kernels.moe.fused import fused_experts
from mla_func.kernels.router.route import route_fused
from mla_func.moe import experts
from mla_func.ops.mlp import swiglu
from mla_func.ops.moe import route
from mla_func.params import DenseMLP

try:  # `python -m scripts.bench moe` / `python -m scripts.bench_moe`
    from scripts import bench_common as common
    from scripts import bench_moe_fp8 as fp8_bench
    from scripts.bench_moe_sweep import print_sweep, short, sweep
except ImportError:  # `python scripts/bench_moe.py`
    import bench_common as common
    import bench_moe_fp8 as fp8_bench
    from bench_moe_sweep import print_sweep, short, sweep


TARGETS = {1: 1.3, 8: 1.3, 32: 1.1, 128: 1.1, 4096: 1.5}

@dataclass(frozen=True)
class Layer:
    router: torch.Tensor
    gate_up: torch.Tensor | Fp8Weight
    down: torch.Tensor | Fp8Weight
    shared_gate_up: torch.Tensor | Fp8Weight
    shared_down: torch.Tensor | Fp8Weight


def make_layers(cfg: MLAConfig, n: int) -> list[Layer]:
    e, h, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    s = cfg.n_shared_experts * i
    kw = dict(device="cuda", dtype=torch.bfloat16)
    # Routers in the weights' dtype, as init_params and load_hf keep them.
    return [Layer(torch.randn(e, h, **kw) * h**-0.5,
                  torch.randn(e, 2, i, h, **kw) * h**-0.5, torch.randn(e, h, i, **kw) * i**-0.5,
                  torch.randn(2, s, h, **kw) * h**-0.5, torch.randn(h, s, **kw) * s**-0.5)
            for _ in range(n)]


# One runtime for every timed call (the model's step uses its state's): its counters and the
# shared experts' side stream, made once.
_RUNTIMES: dict[str, Runtime] = {}


def counters(x: torch.Tensor) -> torch.Tensor:
    key = str(x.device)
    if key not in _RUNTIMES:
        _RUNTIMES[key] = Runtime(x.device)
    return _RUNTIMES[key].counters


def fused_layer(x, layer, cfg, config=None):
    w, ids = route_fused(x, layer.router, None, cfg, counters(x))  # the model's CUDA path
    if config is not None:  # (block-FP8 layers: their e4m3 data and scales)
        weights, scales = fp8_bench.kernel_operands(x, layer)
        return fused_experts(x, w, ids, *weights, config, counters=counters(x), scales=scales)
    shared = DenseMLP(layer.shared_gate_up, layer.shared_down)
    return experts(x, w, ids, layer.gate_up, layer.down, shared, impl="triton",
                   counters=counters(x))


def fused_sep_layer(x, layer, cfg):
    w, ids = route(x, layer.router, None, cfg)
    out = experts(x, w, ids, layer.gate_up, layer.down, impl="triton", counters=counters(x))
    return out + swiglu(x, layer.shared_gate_up, layer.shared_down)


def route_only(x, layer, cfg):
    return route_fused(x, layer.router, None, cfg, counters(x))


def make_experts_only(x, layers, cfg):
    """The fused experts (routed + shared) on routing computed once, outside the graph."""
    routing = {id(layer): route(x, layer.router, None, cfg) for layer in layers}

    def experts_only(x, layer, cfg):
        w, ids = routing[id(layer)]
        shared = DenseMLP(layer.shared_gate_up, layer.shared_down)
        return experts(x, w, ids, layer.gate_up, layer.down, shared, impl="triton",
                       counters=counters(x))
    return experts_only


def grouped_mm_layer(x, layer, cfg):
    """The issue's baseline: a straightforward torch._grouped_mm MoE layer."""
    w, ids = route(x, layer.router, None, cfg)
    topk, n_exp = ids.shape[1], layer.gate_up.shape[0]
    flat = ids.flatten()
    order = flat.argsort(stable=True)
    counts = torch.zeros(n_exp, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = counts.cumsum(0, dtype=torch.int32)
    tok = order // topk
    gu = torch._grouped_mm(x[tok], layer.gate_up.flatten(1, 2).transpose(1, 2), offs=offs)
    gate, up = gu.chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, layer.down.transpose(1, 2), offs=offs)
    y = (y.float() * w.flatten()[order, None]).to(x.dtype)
    out = torch.zeros_like(x).index_add_(0, tok, y)
    return out + swiglu(x, layer.shared_gate_up, layer.shared_down)


def layer_costs(x, layers, cfg, weight_bytes: float = 2) -> tuple[list[tuple[int, int]], float]:
    """(bytes, FLOPs) each layer must move and compute at this step, and the mean number of
    distinct routed experts its routing touches; `weight_bytes` an expert weight (bf16: 2;
    block FP8: `bench_moe_fp8.WEIGHT_BYTES`)."""
    t, h = x.shape
    i, s = cfg.moe_intermediate_size, cfg.n_shared_experts * cfg.moe_intermediate_size
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    costs, distinct = [], 0
    for layer in layers:
        n = route(x, layer.router, None, cfg)[1].unique().numel()
        costs.append((int(weight_bytes * (n * 3 * i * h + 3 * s * h)) + 2 * (e * h + 2 * t * h),
                      2 * t * h * (k * 3 * i + 3 * s + e)))
        distinct += n
    return costs, distinct / len(layers)


def time_rounds_us(fns: dict, x, layers, cfg, rounds: int,
                   probe: Callable[[], float] | None = None) -> dict[str, list[common.Round]]:
    """Each form's `Round`s: `rounds` timings, the forms alternating (`alternating`), each
    captured once in a CUDA graph of every layer; a form that cannot run here is reported and
    left out. `probe` (`common.matmul_probe`) re-measures the matmul ceiling around each
    timing, so that a layer is compared with the rate of its own moment."""
    graphs = {}
    for name, fn in fns.items():
        try:
            graphs[name] = common.capture_graph(
                lambda fn=fn: [fn(x, layer, cfg) for layer in layers])
        except Exception as err:  # noqa: BLE001  (a baseline that cannot run here is reported)
            print(f"  {name}: {type(err).__name__}: {err}"[:300])
    times: dict[str, list[common.Round]] = {name: [] for name in graphs}
    for order in common.alternating(list(graphs), rounds):
        for name in order:
            before = probe() if probe else None
            ms = common.cuda_time_ms(graphs[name].replay, warmup=3, reps=50)
            mhz = common.sm_clock_mhz() if probe else None
            rate = (before + probe()) / 2 if probe else None
            times[name].append(common.Round(ms * 1e3 / len(layers), rate, mhz))
    return times


def case_timer(x, layers, cfg, ref):
    """The sweep's `time_case`: a config's fused layer timed in one round (its CUDA graph of
    every layer) and its relative error against `ref`; (None, None) if it cannot run."""
    def time_case(c: MoEConfig) -> tuple[float | None, float | None]:
        fn = lambda x, lay, cf: fused_layer(x, lay, cf, c)  # noqa: E731
        one = time_rounds_us({short(c): fn}, x, layers, cfg, 1).get(short(c))
        if not one:
            return None, None
        got = fn(x, layers[0], cfg).float()
        return one[0].us, ((got - ref.float()).abs().max() / ref.float().abs().max()).item()
    return time_case


def align_rows(t: int, cfg: MLAConfig) -> list[dict]:
    e, k, s = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_shared_experts
    ids = torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(t)])
    bm = pick_config(t).block_m
    return [{"tokens": t, "impl": f"align_{name}",
             "us": common.graph_time_ms(lambda f=f: f(ids, e, s, bm)) * 1e3}
            for name, f in (("triton", align_triton), ("torch", align_torch))]


def run(argv: list[str] | argparse.Namespace | None = None) -> list[dict]:
    args = argv if isinstance(argv, argparse.Namespace) else parse_args(argv)
    fp8 = args.weights == "fp8"
    if not torch.cuda.is_available():  # after the options: --help and their errors work anywhere
        raise SystemExit("bench_moe needs a CUDA GPU; none is available")
    torch.manual_seed(0)
    cfg = MLAConfig.preset(args.preset)
    ceil = common.measure_ceilings()
    print(f"# {torch.cuda.get_device_name()}: copy {ceil['copy_gbs']:.0f} GB/s, "
          f"bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
    held_start = common.sustained_matmul()
    layers = make_layers(cfg, args.layers)
    if fp8:  # the FP8 layers timed, their bf16 dequantisations beside them
        ceil["fp8_matmul_tflops"] = fp8_rate = fp8_bench.matmul_tflops()
        print(f"# fp8 matmul {fp8_rate or 0:.0f} TFLOP/s (torch._scaled_mm, e4m3)")
        layers = fp8_bench.quantize_layers(layers)
        dense = fp8_bench.dense_layers(layers)
    probe = common.matmul_probe()
    rows, sweeps, aligns, costs_at = [], [], [], {}
    for t in args.tokens:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        costs, distinct = layer_costs(x, layers, cfg)
        costs_at[t] = costs
        floor = common.floor_of(costs, ceil["copy_gbs"], ceil["matmul_tflops"])
        if fp8:
            fp8_floor = common.floor_of(
                layer_costs(x, layers, cfg, fp8_bench.WEIGHT_BYTES)[0], ceil["copy_gbs"],
                ceil["fp8_matmul_tflops"] or ceil["matmul_tflops"])
        got, ref = fused_layer(x, layers[0], cfg), None
        try:
            ref = grouped_mm_layer(x, dense[id(layers[0])] if fp8 else layers[0], cfg)
            err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        except Exception:  # noqa: BLE001  (no grouped_mm here: no baseline)
            err = None
        variants = [("fused", fused_layer), ("fused_sep", fused_sep_layer),
                    ("grouped_mm", grouped_mm_layer), ("route_only", route_only),
                    ("experts_only", make_experts_only(x, layers, cfg))]
        if pick_config(t).pdl and not fp8:  # the same launches without the early start
            no_pdl = replace(pick_config(t), pdl=False)
            variants.insert(1, ("fused_no_pdl",
                                lambda x, layer, cfg, c=no_pdl: fused_layer(x, layer, cfg, c)))
        if fp8:
            variants = fp8_bench.variants(variants, dense, fused_layer, grouped_mm_layer)
        times = time_rounds_us(dict(variants), x, layers, cfg, args.rounds, probe)
        base = times.get("grouped_mm")
        base_us = statistics.median(r.us for r in base) if base else None
        for name, _ in variants:
            got_rounds = times.get(name)
            ts = [r.us for r in got_rounds] if got_rounds else None
            us = statistics.median(ts) if ts else None
            in_fp8 = fp8 and name in ("fused", "experts_only")
            fl = None if name == "route_only" else fp8_floor if in_fp8 else floor
            paired = common.paired_ratios(got_rounds, costs, ceil["copy_gbs"]) \
                if got_rounds and fl and not in_fp8 else []
            rows.append({
                "tokens": t, "impl": name, "us": us, "floor_us": fl,
                "spread": f"{min(ts):.4g}-{max(ts):.4g}" if ts else None, "us_rounds": ts,
                "x_floor": None if us is None or fl is None else us / fl,
                "x_floor_paired": statistics.median(paired) if paired else None,
                "paired_spread": f"{min(paired):.3f}-{max(paired):.3f}" if paired else None,
                "x_floor_rounds": paired,
                "tflops_rounds": [r.tflops for r in got_rounds or []],
                "mhz_rounds": [r.mhz for r in got_rounds or []],
                "mhz": common.median_or_none([r.mhz for r in got_rounds or []]),
                "target": TARGETS.get(t) if name == "fused" else None,
                "vs_baseline": None if us is None or base_us is None else us / base_us,
                "experts_hit": distinct, "config": short(pick_config(t, in_fp8))
                if name == "fused" else "", "err": err if name == "fused" else None,
                "weights": "fp8" if in_fp8 else "bf16", **ceil})
        aligns += align_rows(t, cfg)
        if args.sweep:
            sweeps += sweep(t, case_timer(x, layers, cfg, got if ref is None else ref),
                            fp8_floor if fp8 else floor, fp8)
    held = common.held_sustained_rate(held_start, common.sustained_matmul())
    for row in rows:  # (the sustained rate is bf16's: FP8 rows have none)
        row["x_floor_sustained"] = None if row["us"] is None or row["floor_us"] is None \
            or row["weights"] == "fp8" else row["us"] / common.floor_of(
                costs_at[row["tokens"]], ceil["copy_gbs"], held["sustained_tflops"])
        row.update(held)
    common.print_table(rows, ["tokens", "impl", "us", "spread", "floor_us", "x_floor",
                              "x_floor_sustained", "x_floor_paired", "paired_spread", "mhz",
                              "target", "vs_baseline", "experts_hit", "err", "config"],
                       f"MoE layer ({args.preset}, "
                       f"{fp8_bench.title(ceil) if fp8 else 'bf16'}; us: median of "
                       f"{args.rounds} alternating "
                       f"rounds, spread: their range; x_floor at the run's ceilings (a burst "
                       f"matmul), x_floor_sustained at the matmul rate held under sustained "
                       f"load, x_floor_paired: each round over the floor at the matmul rate "
                       f"probed around it, median and range; mhz: median SM clock after the "
                       f"rounds)")
    print(f"matmul rate held under sustained load: {held['sustained_tflops']:.0f} TFLOP/s, the "
          f"higher of {held['sustained_start_tflops']:.0f} before the layers and "
          f"{held['sustained_end_tflops']:.0f} after them (first block "
          f"{held['first_block_tflops']:.0f}; SM clock at the end {held['sustained_mhz']} MHz)")
    rates = [r for row in rows for r in row["tflops_rounds"] if r]
    if rates:
        print(f"matmul rate probed around the rounds: {min(rates):.0f}-{max(rates):.0f} TFLOP/s "
              f"(start of run: {ceil['matmul_tflops']:.0f})")
    common.print_table(aligns, ["tokens", "impl", "us"], "expert alignment alone")
    if sweeps:
        print_sweep(sweeps, args.tokens, fp8)
    for r in sweeps:
        r["config"] = short(r["config"])
    return rows + aligns + [{"sweep": True, **r} for r in sweeps]


def main(argv: list[str] | None = None) -> None:
    run(argv)


if __name__ == "__main__":
    main()
