"""scripts/bench.py's command line (the benchmarks themselves need a GPU)."""

from scripts.bench import parse


def test_kernel_and_moe_options_reach_their_benchmark():
    args, rest = parse(["kernels", "--batch", "128", "--page", "1", "64", "--ctx", "4096"])
    assert rest == ["--batch", "128", "--page", "1", "64", "--ctx", "4096"]
    assert args.batches == [1, 8, 32, 128] and args.page_size == 64  # the step's, untouched
    args, rest = parse(["step", "--batches", "1", "8", "--page-size", "16", "--out", "/tmp/b"])
    assert args.batches == [1, 8] and args.page_size == 16 and rest == []
