"""Decode plan sweep (H=16, ctx 1024, B=32 and 128) on this GPU: bench_kernels's descent."""
import scripts.bench_kernels as bk

bk.SWEEP_CASES = ((16, 32, 1024), (16, 128, 1024))
bk.main(["--sweep-only", "--sweep-seconds", "120"])
