"""MoE layer (router + experts) at 1024-4096 V2-Lite tokens: the shared experts on a side stream
(`MoEConfig.shared_stream`) against the serial launches, each timed in CUDA graphs.

Variants per token count, all on `pick_config(tokens)` (shared experts apart from 513 tokens):
`serial` (one stream), `stream` (the shared MLP on `fused_moe.side_stream`, priority 0 like the
main stream) and `stream_hi` (the same with a high-priority side stream, swapped into the
module's cache for that variant only: its blocks are dispatched first when SMs free up, so the
shared MLP ends early rather than filling the routed GEMMs' gaps). The variants alternate for
ROUNDS rounds (clock and thermal drift hit them alike); medians are printed. Inputs and timing
are those of `scripts/bench_moe.py` (`make_layers`, `fused_layer`, `time_layer_us`: LAYERS
distinct weight sets per graph, times per layer). Outputs are compared bit for bit with
`serial`, eagerly and from a graph replay.

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run1/exp_shared_stream.py
"""

import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch

from mla_func.config import MLAConfig
from mla_func.kernels import fused_moe
from mla_func.kernels.moe_config import MoEConfig, pick_config
from scripts.bench_common import print_table
from scripts.bench_moe import Layer, fused_layer, make_layers, time_layer_us

TOKENS = (1024, 2048, 4096)
ROUNDS = 3
LAYERS = 4
VARIANTS = ("serial", "stream", "stream_hi")


def replayed(fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`fn()`'s output from one replay of a graph captured after a warm-up."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return out.clone()


@contextmanager
def side(stream: torch.cuda.Stream | None) -> Iterator[None]:
    """Inside, `fused_moe.side_stream` gives `stream` (None: the module's own)."""
    dev = torch.cuda.current_device()
    saved = fused_moe.side_stream(torch.device("cuda", dev))
    fused_moe._SIDE_STREAMS[dev] = saved if stream is None else stream
    try:
        yield
    finally:
        fused_moe._SIDE_STREAMS[dev] = saved


def layer_fn(config: MoEConfig) -> Callable[[torch.Tensor, Layer, MLAConfig], torch.Tensor]:
    """`scripts.bench_moe.fused_layer` with `config`, in `time_layer_us`'s form."""
    return lambda x, lay, cfg: fused_layer(x, lay, cfg, config)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("exp_shared_stream needs a CUDA GPU")
    start = time.perf_counter()
    torch.manual_seed(0)
    cfg = MLAConfig.preset("v2-lite")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    layers = make_layers(cfg, LAYERS)
    high = torch.cuda.Stream(priority=-1)  # clamped to the device's highest priority
    rows = []
    for t in [int(a) for a in sys.argv[1:]] or TOKENS:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        base = pick_config(t)
        on = replace(base, shared_stream=True)
        variants = {"serial": (layer_fn(base), None), "stream": (layer_fn(on), None),
                    "stream_hi": (layer_fn(on), high)}
        want = fused_layer(x, layers[0], cfg, base)
        equal = {}
        for name, (fn, stream) in variants.items():
            with side(stream):
                eager = fn(x, layers[0], cfg)
                graph = replayed(lambda fn=fn, x=x: fn(x, layers[0], cfg))
            equal[name] = torch.equal(eager, want) and torch.equal(graph, want)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(ROUNDS):
            for name in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                fn, stream = variants[name]
                with side(stream):
                    us = time_layer_us(fn, x, layers, cfg)
                times[name].append(float("nan") if us is None else us)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        rows.append({"tokens": t, "serial_us": med["serial"], "stream_us": med["stream"],
                     "ratio": med["stream"] / med["serial"], "stream_hi_us": med["stream_hi"],
                     "ratio_hi": med["stream_hi"] / med["serial"],
                     "equal": all(equal.values()),
                     "rounds": " / ".join(
                         ",".join(f"{u:.0f}" for u in times[n]) for n in VARIANTS)})
        print(f"  t={t}: {rows[-1]['rounds']} us, equal to serial: {equal}", flush=True)
    print_table(rows, ["tokens", "serial_us", "stream_us", "ratio", "stream_hi_us", "ratio_hi",
                       "equal", "rounds"],
                f"MoE layer (v2-lite, bf16, router + experts), median of {ROUNDS} rounds; "
                f"rounds: serial / stream / stream_hi")
    print(f"# {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
