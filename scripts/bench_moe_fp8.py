"""`bench moe --weights fp8` (bench_moe.py): the MoE layer with block-FP8 expert weights
(DeepSeek-V3's format, `fp8.quantize` in 128 x 128 blocks: the routed and shared experts; the
router stays bf16), run by the Triton experts' block-FP8 GEMMs (`kernels/moe/fp8_gemm.py`).

Its floor counts the FP8 bytes (`WEIGHT_BYTES` an expert weight: one e4m3 byte and its share of
a float32 scale a block) and divides the FLOPs by the FP8 matmul rate measured in the same run
(`matmul_tflops`: a dense 8192³ e4m3 product through `torch._scaled_mm`, per-tensor scales,
bf16 out, in a CUDA graph); where this torch or GPU cannot run that product the rate is None
and the floor falls back to the bf16 rate (the table's title says which). The same layers'
dequantised bf16 weights run beside them (`dense_layers`): the bf16 Triton path and the
grouped_mm baseline, so that one run compares the two precisions.
"""

from collections.abc import Callable
from dataclasses import replace

import torch

from mla_func.fp8 import FP8, dequantize, quantize
from mla_func.moe import fp8_operands, fp8_scales
from mla_func.params import DenseMLP

try:  # `python -m scripts.bench moe` / `python -m scripts.bench_moe`
    from scripts import bench_common as common
except ImportError:  # `python scripts/bench_moe.py`
    import bench_common as common

BLOCK = 128  # DeepSeek-V3's checkpoint blocks (and the FP8 GEMMs' one K step)
WEIGHT_BYTES = 1 + 4 / (BLOCK * BLOCK)  # an e4m3 byte and its share of a float32 scale


def quantize_layers(layers: list) -> list:
    """Each layer (`bench_moe.Layer`) with its routed and shared experts in block FP8."""
    return [replace(layer, gate_up=quantize(layer.gate_up, BLOCK, 2, 1),
                    down=quantize(layer.down, BLOCK, 1, 1),
                    shared_gate_up=quantize(layer.shared_gate_up, BLOCK, 1, 1),
                    shared_down=quantize(layer.shared_down, BLOCK, 0, 1)) for layer in layers]


def kernel_operands(x: torch.Tensor, layer) -> tuple[tuple, object]:
    """The weights `fused_experts` takes for `layer` (routed gate_up, down, shared gate_up,
    down) and their `Fp8Scales`: block-FP8 layers' e4m3 data and scales as `mla_func.moe`
    passes them; a bf16 layer's weights as they are, no scales."""
    shared = DenseMLP(layer.shared_gate_up, layer.shared_down)
    fp8 = fp8_operands(x, "triton", layer.gate_up, layer.down, shared)
    if fp8 is None:
        return (layer.gate_up, layer.down, layer.shared_gate_up, layer.shared_down), None
    data, kw = fp8
    return data, fp8_scales(kw["gate_up_scales"], kw["down_scales"],
                            kw.get("shared_gate_up_scales"), kw.get("shared_down_scales"),
                            kw["block_rows"])


def dense_layers(layers: list) -> dict[int, object]:
    """id(FP8 layer) -> the same layer with its weights dequantised to bf16."""
    return {id(layer): replace(layer, **{f: dequantize(getattr(layer, f), torch.bfloat16)
                                         for f in ("gate_up", "down", "shared_gate_up",
                                                   "shared_down")})
            for layer in layers}


def matmul_tflops(size: int = 8192) -> float | None:
    """The e4m3 matmul rate (TFLOP/s) of a `size`³ `torch._scaled_mm` product replayed in a
    CUDA graph; None where it does not run here (an older GPU or torch), reported."""
    try:
        a = torch.randn(size, size, device="cuda").to(FP8)
        b = torch.randn(size, size, device="cuda").to(FP8).T  # column-major, as it wants
        one = torch.ones((), device="cuda")

        def product() -> torch.Tensor:
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        graph = common.capture_graph(product)
        return 2 * size**3 / (common.cuda_time_ms(graph.replay, reps=10) * 1e-3) / 1e12
    except Exception as err:  # noqa: BLE001  (no FP8 product here: the floor says so)
        print(f"# fp8 matmul rate: not measured ({type(err).__name__}: {err})"[:300])
        return None


Form = tuple[str, Callable]  # (name, fn(x, layer, cfg)), as bench_moe times them


def variants(forms: list[Form], dense: dict[int, object], fused_layer: Callable,
             grouped_mm_layer: Callable) -> list[Form]:
    """The forms of an FP8 run: `fused`, `experts_only` and `route_only` as they are (the
    experts in FP8), `fused_bf16` (the bf16 Triton path) and `grouped_mm` on the dequantised
    weights; `fused_sep` left out (it would dequantise the shared MLP at every call)."""
    out: list[Form] = []
    for name, fn in forms:
        if name == "grouped_mm":
            out.append((name, lambda x, layer, cfg: grouped_mm_layer(x, dense[id(layer)], cfg)))
        elif name != "fused_sep":
            out.append((name, fn))
    out.insert(1, ("fused_bf16", lambda x, layer, cfg: fused_layer(x, dense[id(layer)], cfg)))
    return out


def title(ceil: dict) -> str:
    """The table title's precision: which forms run FP8, and the rate of their floor."""
    rate = ceil.get("fp8_matmul_tflops")
    at = (f"the fp8 matmul rate {rate:.0f} TFLOP/s" if rate
          else "the bf16 rate (no fp8 product ran)")
    return f"fused / experts_only: FP8 experts, floor in FP8 bytes at {at}; the rest bf16"


__all__ = ["BLOCK", "WEIGHT_BYTES", "dense_layers", "kernel_operands", "matmul_tflops",
           "quantize_layers", "title", "variants"]
