"""The MLA kernel benchmark's measuring tools (`bench_kernels.py`, GPU only): V2/V3-shaped
decode inputs, CUDA-graph timing of a function or of a decode plan, plan labels, the ceilings
and the floor.

Floor = max(bytes / copy bandwidth, FLOPs / bf16 matmul rate) (docs/PERF.md,
"Conventions"), both ceilings measured in the same run (`ceilings`). Times are medians of
`triton.testing.do_bench` over CUDA-graph replays; do_bench flushes L2 before every replay, so
small cases are not served from cache. With an FP8 cache (`kv_dtype="fp8"`,
`mla_func.cache_fp8`) the inputs hold the bf16 cache's rows quantised, and the bytes moved
count its 656-byte rows.
"""

import math

import torch

from mla_func.cache_fp8 import fp8_layout, pack_rows
from mla_func.kernels.attention.decode import (
    DecodePlan,
    DecodeWorkspace,
    effective_plan,
    mla_decode,
)

try:  # `python -m scripts.bench kernels` / `python -m scripts.bench_kernels`
    from scripts.bench_common import measure_ceilings
except ImportError:  # `python scripts/bench_kernels.py`
    from bench_common import measure_ceilings

NOPE, ROPE, V_HEAD, KV_LORA = 128, 64, 128, 512
LATENT = KV_LORA + ROPE


def bench_us(fn) -> float:
    """Median µs of `fn` replayed from a CUDA graph (launch overhead excluded; do_bench
    flushes L2 before each replay). Falls back to eager timing if `fn` cannot be captured."""
    import triton.testing

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile, allocate
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as err:
        print(f"  (not capturable, timed eagerly: {str(err)[:60]})")
        return triton.testing.do_bench(fn, return_mode="median") * 1e3
    return triton.testing.do_bench(graph.replay, return_mode="median") * 1e3


def ceilings() -> dict:
    """Copy bandwidth (bytes read + written) and bf16 matmul rate, measured now."""
    found = measure_ceilings()
    return {"copy_GBps": found["copy_gbs"], "matmul_TFLOPs": found["matmul_tflops"]}


def row_bytes(kv_dtype: str = "auto") -> int:
    """Bytes of one cached token (one layer): bf16 values, or the FP8 row."""
    return fp8_layout(KV_LORA, ROPE).row_bytes if kv_dtype == "fp8" else LATENT * 2


def decode_inputs(heads: int, batch: int, ctx: int, page: int, seed: int = 0,
                  kv_dtype: str = "auto") -> dict:
    """bf16 V2/V3-shaped decode inputs: every sequence at `ctx` keys, pages shuffled; the
    cache's rows quantised to FP8 rows where `kv_dtype` is "fp8"."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    per_seq = -(-ctx // page)
    pages = batch * per_seq + 1
    cache = torch.randn(pages, page, LATENT, device="cuda", dtype=torch.bfloat16, generator=g)
    if kv_dtype == "fp8":  # a few thousand pages at a time: pack_rows works in float32
        cache = torch.cat([pack_rows(part, KV_LORA) for part in cache.split(4096)])
    order = torch.randperm(pages - 1, device="cuda", generator=g).to(torch.int32) + 1
    table = order.view(batch, per_seq)

    def rnd(*shape, s=1.0):
        return torch.randn(*shape, device="cuda", generator=g).mul_(s).to(torch.bfloat16)

    return {
        "q_nope": rnd(batch, heads, NOPE), "q_pe": rnd(batch, heads, ROPE), "cache": cache,
        "w_uk": rnd(heads, NOPE, KV_LORA, s=NOPE**-0.5),
        "w_uv": rnd(heads, V_HEAD, KV_LORA, s=KV_LORA**-0.5),
        "token_seq": torch.arange(batch, device="cuda", dtype=torch.int32),
        "positions": torch.full((batch,), ctx - 1, device="cuda", dtype=torch.int32),
        "page_table": table, "scale": (NOPE + ROPE) ** -0.5,
    }

def plan_label(plan: DecodePlan) -> str:
    """Short name of a plan: tiling (heads, keys, warps, stages); shared-p: p through scratch;
    ws: the warp-specialised kernel; fp8: an FP8 cache, group-scores: decode_fp8.py's kernel,
    f16: its float16 products."""
    return (f"h{plan.block_h}n{plan.block_n}w{plan.num_warps}s{plan.num_stages}"
            f"{' shared-p' if plan.shared_p else ''}{' ws' if plan.ws else ''}"
            f"{' fp8' if plan.fp8 else ''}{' group-scores' if plan.group_scores else ''}"
            f"{' f16' if plan.f16 else ''}")


def time_plan(p: dict, plan: DecodePlan, strict: bool = False,
              shrunk: dict[DecodePlan, DecodePlan] | None = None) -> float:
    """Median µs of the latent kernel (split + merge) under `plan` on inputs `p`; strict: inf
    if the plan ran out of resources and shrank (`effective_plan`). `shrunk`: where a plan
    that shrank is recorded (default: a record of this call's own)."""
    shrunk = {} if shrunk is None else shrunk
    batch, heads = p["q_nope"].shape[:2]
    ws = DecodeWorkspace()
    q_lat, o_lat, part_o, part_lse = ws.get(torch.device("cuda"), torch.bfloat16, batch, heads,
                                            KV_LORA, plan.num_splits)
    scratch = None
    if plan.shared_p:
        scratch = ws.shared_p(torch.device("cuda"), torch.bfloat16, batch, heads, plan)
    q_lat.copy_(torch.einsum("thn,hnc->htc", p["q_nope"], p["w_uk"]))

    def kernel():
        mla_decode(q_lat, p["q_pe"], p["cache"], p["page_table"], p["token_seq"],
                   p["positions"], p["scale"], plan, o_lat, part_o, part_lse, scratch,
                   shrunk=shrunk)

    us = bench_us(kernel)
    return us if effective_plan(plan, shrunk) == plan or not strict else math.inf


def floors(heads: int, batch: int, ctx: int, ceil: dict, kv_dtype: str = "auto"
           ) -> tuple[int, float]:
    """(bytes moved, floor µs) of one decode case (the cache's rows in `kv_dtype`)."""
    kv_bytes = batch * ctx * row_bytes(kv_dtype)
    io_bytes = batch * heads * (2 * KV_LORA + ROPE) * 2
    flops = 2 * batch * heads * ctx * (LATENT + KV_LORA)
    return kv_bytes + io_bytes, max((kv_bytes + io_bytes) / ceil["copy_GBps"] / 1e3,
                                    flops / ceil["matmul_TFLOPs"] / 1e6)
