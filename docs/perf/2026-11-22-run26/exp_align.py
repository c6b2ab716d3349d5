"""Expert alignment alone: the Triton kernels (one program, or the two sliced launches) against
the torch ops, per token count, V2-Lite (64 experts, top-6) and V3 (256 experts, top-8) shapes,
shared experts apart (as the MoE runs them past 512 tokens) and folded.

Run from the repository root: PYTHONPATH=.:/tmp/site python3 docs/perf/.../exp_align.py
"""
import torch

from mla_func.kernels import moe_align
from mla_func.kernels.moe_align import align_torch, align_triton
from scripts.bench_common import graph_time_ms


# Runs 26 and 27 ran this with the pair threshold of that time (one program up to 8192 pairs).
ONE_MAX = 8192


def main() -> None:
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    for name, e, k, shapes in (("v2-lite", 64, 6, ((0, 128), (2, 16))),
                               ("v3", 256, 8, ((0, 128), (1, 16)))):
        for t in (128, 256, 512, 1024, 2048, 4096, 8192, 16384):
            ids = torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(t)])
            for shared, bm in shapes:
                pairs = t * (k + shared)
                path = "one" if pairs <= ONE_MAX else "sliced"
                moe_align.ONE_PROGRAM_MAX_BINNED = 1 << 40 if path == "one" else 0
                a = align_torch(ids, e, shared, bm)
                b = align_triton(ids, e, shared, bm)
                same = torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
                tri = graph_time_ms(lambda: align_triton(ids, e, shared, bm)) * 1e3
                tor = graph_time_ms(lambda: align_torch(ids, e, shared, bm)) * 1e3
                forced = ""
                if path == "one":  # the sliced launches at this size too
                    moe_align.ONE_PROGRAM_MAX_BINNED = 0
                    c = align_triton(ids, e, shared, bm)
                    ok = torch.equal(a[1], c[1]) and torch.equal(a[2], c[2])
                    us = graph_time_ms(lambda: align_triton(ids, e, shared, bm)) * 1e3
                    forced = f"  sliced {us:7.1f} us equal={ok}"
                print(f"  {name} t={t:5d} shared={shared} pairs={pairs:6d} bm={bm:3d} "
                      f"triton({path}) {tri:7.1f} us  torch {tor:7.1f} us  tiles_equal={same}"
                      f"{forced}", flush=True)


if __name__ == "__main__":
    main()
