"""scripts/bench.py's command line (the benchmarks themselves need a GPU)."""

import pytest
import torch

from scripts.bench import parse


def test_kernel_and_moe_options_reach_their_benchmark():
    args, rest = parse(["kernels", "--batch", "128", "--page", "1", "64", "--ctx", "4096"])
    assert rest == ["--batch", "128", "--page", "1", "64", "--ctx", "4096"]
    assert args.batches == [1, 8, 32, 128] and args.page_size == 64  # the step's, untouched
    args, rest = parse(["step", "--batches", "1", "8", "--page-size", "16", "--out", "/tmp/b"])
    assert args.batches == [1, 8] and args.page_size == 16 and rest == []


def test_timing_rounds_alternate_the_cases():
    """`bench moe --rounds`: every case once a round, the order reversed every other round."""
    from scripts.bench_common import alternating

    names = ["fused", "grouped_mm", "route_only"]
    got = alternating(names, 3)
    assert got == [names, names[::-1], names]
    assert alternating(names, 0) == [] and names == ["fused", "grouped_mm", "route_only"]
    args, rest = parse(["moe", "--tokens", "4096", "--rounds", "7"])
    assert rest == ["--tokens", "4096", "--rounds", "7"]  # handed on to bench_moe
    from scripts.bench_moe import run

    with pytest.raises(SystemExit, match="--rounds must be at least 1"):
        run(["--rounds", "0"])  # before any GPU work


def test_distinct_experts_counts_every_moe_layer():
    """The step floor's expert count: one entry per MoE layer of an eager step (CPU, tiny)."""
    import mla_func as mf
    from mla_func.params import MoE
    from mla_func.state import init_state
    from scripts.bench_step import count_distinct_experts

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=0)
    state = init_state(cfg, num_pages=8, page_size=4)
    batch = mf.make_batch([mf.SeqWork([3, 4, 5], 0, [1])], 4, 4)
    seen = count_distinct_experts(params, state, batch)
    assert len(seen) == sum(isinstance(layer.mlp, MoE) for layer in params.layers) > 0
    assert all(1 <= n <= cfg.n_routed_experts for n in seen)


def test_generate_floor_is_one_step_of_every_request_at_the_mean_context():
    """`generate`'s ceiling: one decode step of all requests at prompt + new / 2 (CPU, tiny)."""
    from argparse import Namespace

    import mla_func as mf
    from mla_func.state import init_state
    from scripts.bench_step import generate_floor

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=0)
    state = init_state(cfg, num_pages=32, page_size=4)
    args = Namespace(gen_prompt=9, gen_new=6, gen_requests=3, backend="torch", max_pages=4)
    ceil = {"copy_gbs": 1.0, "matmul_tflops": 1e-3}
    got = generate_floor(params, state, ceil, args)
    assert got["ctx"] == 12
    kv = 3 * 13 * cfg.latent_dim * cfg.num_hidden_layers * params.embed.element_size()
    assert got["bytes_gb"] * 1e9 > kv + params.lm_head.numel() * params.embed.element_size()
    assert got["floor_ms"] >= got["bytes_gb"] * 1e3  # its bytes over 1 GB/s, in ms


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
@pytest.mark.parametrize("what", ["step", "kernels", "moe", "capture", "all"])
def test_bench_without_cuda_fails_clearly_and_writes_nothing(what, tmp_path):
    from scripts.bench import main

    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=f"bench {what} needs a CUDA GPU"):
        main([what, "--out", str(out)])
    assert not out.exists()


def test_bench_step_rejects_unknown_arguments(tmp_path):
    from scripts.bench import main

    with pytest.raises(SystemExit, match="unknown arguments --batchez 3"):
        main(["step", "--batchez", "3", "--out", str(tmp_path / "out")])


def test_profile_generate_timeline_accounts_for_every_step(capsys):
    """The timeline's kinds of step add up to the engine's steps and to every token the steps
    ran (prompts, then one token a decode); on a CPU its GPU columns stay empty."""
    import mla_func as mf
    from scripts.profile_generate import main, summary, timed_steps

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=0)
    engine = mf.Engine(cfg, params, num_pages=40, page_size=8, max_batch_tokens=48, max_seqs=4,
                       eos_token_id=None, progress=False)
    log: list = []
    engine._step_fn = timed_steps(engine._step_fn, log)
    requests, prompt, new = 5, 30, 4
    for i in range(requests):
        engine.submit(list(range(2 + i, 2 + i + prompt)), new)
    engine.run(progress=False)
    rows = summary(log)
    assert sum(r["count"] for r in rows) == engine.steps == len(log)
    assert sum(r["tokens"] for r in rows) == requests * prompt + requests * (new - 1)
    kinds = {r["steps"] for r in rows}
    assert {"prefill, eager", "decode, eager"} <= kinds
    assert all(r["gpu_ms_sum"] is None for r in rows)
    main(["--preset", "tiny", "--device", "cpu", "--mode", "eager", "--requests", "3",
          "--prompt", "20", "--new", "3", "--page-size", "8", "--max-batch-tokens", "32",
          "--timeline"])
    out = capsys.readouterr().out
    assert "steps by kind" in out and "decode, eager" in out
