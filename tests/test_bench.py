"""scripts/bench.py's command line and the benchmarks' CPU-side output (the benchmarks
themselves need a GPU)."""

import argparse
import json

import pytest
import torch

from scripts.bench import parse


def own_parse(name: str, argv: list[str]) -> argparse.Namespace:
    """`argv` read by benchmark `name`'s own parser, as its `run` reads it."""
    if name == "capture":
        from scripts.bench_capture import _parse

        return _parse(argv)
    if name == "kernels":
        from scripts.bench_kernels import parse_args

        return parse_args(argv)
    if name == "fp8":
        from scripts.bench_fp8 import parse_args

        return parse_args(argv)
    p = argparse.ArgumentParser()
    if name == "moe":
        from scripts.bench_moe import add_args

        add_args(p)
    else:
        from scripts.bench_step import add_arguments

        add_arguments(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("argv, want", [
    (["capture", "--backend", "torch", "--page-size", "64", "--max-tokens", "128",
      "--batches", "1,8"],
     {"capture": {"backend": "torch", "page_size": 64, "max_tokens": 128, "batches": "1,8"}}),
    (["kernels", "--batch", "128", "--page", "1", "64", "--ctx", "4096"],
     {"kernels": {"batch": [128], "page": [1, 64], "ctx": [4096]}}),
    (["moe", "--tokens", "4096", "--rounds", "7", "--weights", "fp8"],
     {"moe": {"tokens": [4096], "rounds": 7, "weights": "fp8"}}),
    (["fp8", "--rows", "1", "16", "--shapes", "576x2048", "7168X18432"],
     {"fp8": {"rows": [1, 16], "shapes": [(576, 2048), (7168, 18432)]}}),
    (["step", "--batches", "1", "8", "--page-size", "16", "--backend", "torch"],
     {"step": {"batches": [1, 8], "page_size": 16, "backend": "torch"}}),
    (["all", "--tokens", "4096", "--batch", "8", "--backend", "torch", "--page-size=32",
      "--max-tokens", "256"],
     {"kernels": {"batch": [8], "page": [1, 64]}, "moe": {"tokens": [4096], "rounds": 5},
      "capture": {"backend": "torch", "page_size": 32, "max_tokens": 256},
      "step": {"backend": "torch", "page_size": 32, "max_tokens": 256,
               "batches": [1, 8, 32, 128]}}),
])
def test_each_option_reaches_its_own_benchmarks_parser(argv, want, tmp_path):
    """What `parse` hands each benchmark, read by that benchmark's own parser, carries the
    values asked for (and the defaults elsewhere); `--out` stays bench.py's."""
    args, routed = parse([*argv[:1], "--out", str(tmp_path), *argv[1:]])
    assert args.what == argv[0] and args.out == str(tmp_path)
    assert list(routed) == list(want)  # `all`: kernels, moe, capture, step
    for name, values in want.items():
        got = vars(own_parse(name, routed[name]))
        assert {k: got[k] for k in values} == values, name


@pytest.mark.parametrize("argv, name", [
    (["step", "--batchez", "3"], "--batchez"),
    (["step", "--batch", "3"], "--batch"),  # kernels' option, never an abbreviation
    (["kernels", "--batches", "3"], "--batches"),  # the step's option, not kernels'
    (["capture", "--tokens", "8"], "--tokens"),
    (["moe", "--page-size=16"], "--page-size"),
    (["all", "--tokens", "8", "--nope", "1"], "--nope"),
    (["step", "5"], "5"),
    (["fp8", "--tokens", "8"], "--tokens"),
])
def test_an_option_no_benchmark_takes_is_refused_by_name(argv, name, tmp_path, monkeypatch):
    """Refused by `main` before the CUDA check (a GPU pretended here) and before --out."""
    from scripts.bench import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=f"^bench {argv[0]}: unknown .*{name} "):
        main([*argv, "--out", str(out)])
    assert not out.exists()


def test_all_refuses_a_value_one_of_its_benchmarks_refuses(capsys):
    """`all --batches 1 8`: the step takes it, bench_capture (`--batches 1,8`) does not."""
    with pytest.raises(SystemExit):
        parse(["all", "--batches", "1", "8"])
    err = capsys.readouterr().err
    assert "bench capture" in err and "unrecognized arguments: 8" in err


def test_help_lists_the_subcommands_benchmarks_options(capsys):
    with pytest.raises(SystemExit) as e:
        parse(["capture", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--out" in out and "--max-seqs" in out and "--gen-requests" not in out


def test_benchmarks_refuse_unknown_options_when_run_alone(monkeypatch, capsys):
    """bench_moe and bench_capture called on their own (not through bench.py) refuse a
    mistyped option instead of ignoring it (argparse's usage error, before any GPU work:
    CUDA is faked present, so a bench that ignored the option would go on past it)."""
    from scripts.bench_capture import _parse
    from scripts.bench_moe import run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for call, bad in ((run, "--tokenz"), (_parse, "--page-sise")):
        with pytest.raises(SystemExit) as info:
            call([bad, "8"])
        assert info.value.code == 2
        assert f"unrecognized arguments: {bad} 8" in capsys.readouterr().err
    assert _parse(["--page-size", "8"]).page_size == 8


@pytest.mark.parametrize("module", ["bench_kernels", "bench_moe", "bench_fp8"])
def test_standalone_benchmarks_help_and_cpu_errors(module, monkeypatch, capsys):
    """`python -m scripts.bench_kernels|bench_moe|bench_fp8`: --help works without a GPU, and a run
    without one ends in one line, not a traceback."""
    import importlib

    main = importlib.import_module(f"scripts.{module}").main
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "usage:" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=f"^{module} needs a CUDA GPU; none is available$"):
        main([])


def test_timing_rounds_alternate_the_cases(capsys):
    """`bench moe --rounds`: every case once a round, the order reversed every other round."""
    from scripts.bench_common import alternating

    names = ["fused", "grouped_mm", "route_only"]
    got = alternating(names, 3)
    assert got == [names, names[::-1], names]
    assert alternating(names, 0) == [] and names == ["fused", "grouped_mm", "route_only"]
    from scripts.bench_moe import run

    with pytest.raises(SystemExit):
        run(["--rounds", "0"])  # argparse refuses it, before any GPU work
    assert "--rounds: must be at least 1" in capsys.readouterr().err


def test_moe_rounds_carry_the_matmul_rate_probed_around_each_timing(monkeypatch):
    """`bench moe`: with a probe, each timing carries the mean of the matmul rates probed just
    before and just after it and the SM clock read after it, and its paired ratio is taken
    against the floor at that rate. Scripted as a GPU whose clocks drop under load: the later
    timings are slower, and so are the rates around them (graphs and timers faked)."""
    from scripts import bench_common, bench_moe

    ms = iter([4.0, 8.0, 8.8, 4.4])  # a, b in round 0; b, a in round 1
    rates = iter([100.0, 90.0, 90.0, 80.0, 80.0, 70.0, 70.0, 60.0])
    clocks = iter([1980, 1900, 1800, 1700])
    monkeypatch.setattr(bench_common, "capture_graph", lambda fn: argparse.Namespace(replay=fn))
    monkeypatch.setattr(bench_common, "cuda_time_ms", lambda fn, warmup, reps: next(ms))
    monkeypatch.setattr(bench_common, "sm_clock_mhz", lambda: next(clocks))
    fns = {"a": lambda x, layer, cfg: None, "b": lambda x, layer, cfg: None}
    got = bench_moe.time_rounds_us(fns, None, [0, 1], None, 2, probe=lambda: next(rates))
    Round = bench_common.Round
    assert got == {"a": [Round(2000.0, 95.0, 1980), Round(2200.0, 65.0, 1700)],
                   "b": [Round(4000.0, 85.0, 1900), Round(4400.0, 75.0, 1800)]}
    # FLOP-bound layers (1 TFLOP each): the floor is 1e6 / rate µs, the ratio us * rate / 1e6.
    costs = [(10**9, 10**12), (2 * 10**9, 10**12)]
    assert bench_common.floor_of(costs, 1000.0, 100.0) == pytest.approx(1e4)
    assert bench_common.paired_ratios(got["a"], costs, 1000.0) == pytest.approx([0.19, 0.143])
    # Bytes-bound at a low copy bandwidth: the larger term wins, layer by layer.
    assert bench_common.floor_of(costs, 0.1, 100.0) == pytest.approx((1e4 + 2e4) / 2 * 1e3)
    # Without a probe nothing is probed or read, and no ratio is paired.
    ms = iter([4.0])
    plain = bench_moe.time_rounds_us({"a": fns["a"]}, None, [0, 1], None, 1)
    assert plain == {"a": [Round(2000.0)]}
    assert bench_common.paired_ratios(plain["a"], costs, 1000.0) == []


@pytest.mark.parametrize("tokens", [1, 128])
def test_moe_sweep_descends_to_the_fastest_right_config(tokens, capsys):
    """`bench moe --sweep` (timings faked): coordinate descent over both GEMMs' tiles keeps
    the fastest config (gate_up's K split too, at a few tokens); a config whose output is
    off (error 0.5, or NaN) is reported WRONG and never chosen; every case is printed as it
    is timed; the summary names the best next to the default."""
    import math

    from mla_func.kernels.moe.config import pick_config
    from scripts.bench_moe_sweep import print_sweep, short, sweep

    def time_case(c):
        if c.gate_up == (128, 128, 8, 3):  # fastest of all, but wrong
            return 1.0, 0.5
        if c.down == (64, 64, 4, 4):  # fast, but NaN
            return 2.0, math.nan
        return 100.0 + c.gate_up[0] + c.down[0] / 10 + c.block_m / 100 - 5 * (
            c.gate_up_split == 3), 0.001

    rows = sweep(tokens, time_case, floor=50.0)
    ran = [r for r in rows if r["us"] is not None]
    best = min(ran, key=lambda r: r["us"])
    assert best["config"].gate_up[0] == 32 and best["config"].down[0] == 32
    # gate_up's K split is tried on the direct path only (up to 4 tokens).
    assert best["config"].gate_up_split == (3 if tokens == 1 else 1)
    assert all(r["config"].gate_up != (128, 128, 8, 3) and r["config"].down != (64, 64, 4, 4)
               for r in ran)
    assert any(r["us"] is None for r in rows) and len({r["config"] for r in rows}) == len(rows)
    assert best["x_floor"] == pytest.approx(best["us"] / 50.0)
    timed = capsys.readouterr().out  # each case as it came, before any summary
    assert f"{tokens} tokens {best['us']:.1f} us: {short(best['config'])}" in timed
    assert timed.count(" us: ") == len(ran)
    print_sweep(rows, [tokens])
    out = capsys.readouterr().out
    assert "WRONG (err 0.5)" in timed and short(best["config"]) in out
    assert short(pick_config(tokens)) in out


def test_sustained_floor_takes_the_higher_of_the_two_readings():
    """`bench moe` measures the sustained matmul rate before and after the layers and takes
    the higher (the lower floor: the conservative ratio), keeping both readings."""
    from scripts.bench_common import held_sustained_rate

    start = {"sustained_tflops": 680.0, "sustained_mhz": 1290, "first_block_tflops": 780.0}
    end = {"sustained_tflops": 700.0, "sustained_mhz": 1350, "first_block_tflops": 760.0}
    for a, b in ((start, end), (end, start)):
        got = held_sustained_rate(a, b)
        assert got["sustained_tflops"] == 700.0 and got["sustained_mhz"] == 1350
        assert (got["sustained_start_tflops"], got["sustained_end_tflops"]) == (
            a["sustained_tflops"], b["sustained_tflops"])


@pytest.mark.cuda
def test_matmul_rate_probes_run_on_a_gpu():
    """The probes `bench moe` pairs its timings with return rates (small sizes: no timing is
    asserted), and a probe still replays after a later capture has emptied the cache."""
    from scripts.bench_common import capture_graph, matmul_probe, sustained_matmul

    probe = matmul_probe(size=1024, reps=2)
    held = sustained_matmul(seconds=0.05, size=1024, block=2)
    x = torch.randn(1024, device="cuda")
    capture_graph(lambda: x * 2)  # torch.cuda.graph empties the allocator's cache
    torch.cuda.synchronize()
    for rate in (probe(), held["sustained_tflops"], held["first_block_tflops"]):
        assert 0 < rate < float("inf")


@pytest.mark.cuda
def test_ceilings_include_the_read_rate():
    """`measure_ceilings` reads the copy, read-only and matmul ceilings; a read stream moves
    half a copy's bytes, so it is well above half the copy figure (no timing is asserted
    beyond that order)."""
    from scripts.bench_common import measure_ceilings

    ceil = measure_ceilings()
    assert set(ceil) == {"copy_gbs", "read_gbs", "matmul_tflops", "read_probes_gbs"}
    assert ceil["read_gbs"] == max(ceil["read_probes_gbs"].values())
    assert ceil["copy_gbs"] / 2 < ceil["read_gbs"] < float("inf")


def test_step_floor_at_the_read_rate_scales_the_bytes():
    """A decode row's second floor: the same bytes over the read-only rate (CPU, tiny); no
    read rate (an older ceilings dict), no second floor."""
    import mla_func as mf
    from scripts.bench_decode import step_floor

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=0)
    moe_layers = sum(isinstance(layer.mlp, mf.params.MoE) for layer in params.layers)
    distinct = [cfg.num_experts_per_tok] * moe_layers
    slow = {"copy_gbs": 1.0, "matmul_tflops": 1e3}  # bytes-bound: the matmul rate is huge
    got = step_floor(params, distinct, batch=2, ctx=8, ceil={**slow, "read_gbs": 1.25})
    assert got["floor_ms"] == pytest.approx(got["bytes_gb"] * 1e3)
    assert got["floor_read_ms"] == pytest.approx(got["floor_ms"] / 1.25)
    assert "floor_read_ms" not in step_floor(params, distinct, batch=2, ctx=8, ceil=slow)


@pytest.mark.parametrize("reading, want", [(1755, 1755), (RuntimeError("no NVML"), None)])
def test_sm_clock_reads_nvml_or_says_it_cannot(reading, want, monkeypatch):
    from scripts.bench_common import sm_clock_mhz

    def clock_rate():
        if isinstance(reading, Exception):
            raise reading
        return reading
    monkeypatch.setattr(torch.cuda, "clock_rate", clock_rate)
    assert sm_clock_mhz() == want


def test_distinct_experts_counts_every_moe_layer():
    """The step floor's expert count: one entry per MoE layer of an eager step (CPU, tiny)."""
    import mla_func as mf
    from mla_func.params import MoE
    from mla_func.state import init_state
    from scripts.bench_common import StateChain
    from scripts.bench_decode import count_distinct_experts

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=0)
    state = init_state(cfg, num_pages=8, page_size=4)
    batch = mf.make_batch([mf.SeqWork([3, 4, 5], 0, [1])], 4, 4)
    chain = StateChain(state)
    seen = count_distinct_experts(params, chain, batch)
    assert chain.state is not state and chain.state.cache is state.cache  # passed on
    assert len(seen) == sum(isinstance(layer.mlp, MoE) for layer in params.layers) > 0
    assert all(1 <= n <= cfg.n_routed_experts for n in seen)


def test_generate_floor_is_one_step_of_every_request_at_the_mean_context():
    """`generate`'s ceiling: one decode step of all requests at prompt + new / 2 (CPU, tiny)."""
    from argparse import Namespace

    import mla_func as mf
    from mla_func.state import init_state
    from scripts.bench_common import StateChain
    from scripts.bench_step import generate_floor

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=0)
    state = init_state(cfg, num_pages=32, page_size=4)
    args = Namespace(gen_prompt=9, gen_new=6, gen_requests=3, backend="torch", max_pages=4)
    ceil = {"copy_gbs": 1.0, "matmul_tflops": 1e-3}
    got = generate_floor(params, StateChain(state), ceil, args)
    assert got["ctx"] == 12
    kv = 3 * 13 * cfg.latent_dim * cfg.num_hidden_layers * params.embed.element_size()
    assert got["bytes_gb"] * 1e9 > kv + params.lm_head.numel() * params.embed.element_size()
    assert got["floor_ms"] >= got["bytes_gb"] * 1e3  # its bytes over 1 GB/s, in ms



@pytest.mark.parametrize("what", ["step", "kernels", "moe", "capture", "all"])
def test_bench_without_cuda_fails_clearly_and_writes_nothing(what, tmp_path, monkeypatch):
    from scripts.bench import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=f"bench {what} needs a CUDA GPU; none is available"):
        main([what, "--out", str(out)])
    assert not out.exists()


def test_main_writes_each_benchmarks_json(tmp_path, monkeypatch):
    """`bench all` runs kernels, moe, capture, step, each on its own options, and writes
    bench_<name>.json of what each returned (the runs faked: no GPU here)."""
    from scripts import bench_capture, bench_kernels, bench_moe, bench_step
    from scripts.bench import main

    calls = []

    def fake(name):
        def run(args):
            calls.append((name, args))
            return [{"bench": name, "us": 1.5}]
        return run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for module in (bench_kernels, bench_moe, bench_capture, bench_step):
        monkeypatch.setattr(module, "run", fake(module.__name__.split("_")[-1]))
    out = tmp_path / "out"
    assert main(["all", "--out", str(out), "--tokens", "4096", "--backend", "torch",
                 "--no-ref"]) == 0
    assert [name for name, _ in calls] == ["kernels", "moe", "capture", "step"]
    argvs = dict(calls)
    assert argvs["kernels"] == ["--no-ref"] and argvs["moe"] == ["--tokens", "4096"]
    assert argvs["capture"] == ["--backend", "torch"]
    step = argvs["step"]
    assert step.out == str(out) and step.backend == "torch" and step.batches == [1, 8, 32, 128]
    for name in argvs:
        got = json.loads((out / f"bench_{name}.json").read_text())
        assert got == [{"bench": name, "us": 1.5}]


def test_print_table_formats_and_says_when_empty(capsys):
    from scripts.bench_common import print_table

    rows = [{"batch": 1, "ms": 0.012345, "big": 12345.6, "note": None},
            {"batch": 128, "ms": 2.0, "big": 250.25}]
    print_table(rows, ["batch", "ms", "big", "note"], "decode")
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["", "## decode", "batch | ms     | big   | note"]
    assert lines[3] == "------|--------|-------|-----"
    assert lines[4:] == ["1     | 0.0123 | 12346 |     ", "128   | 2      | 250   |     "]
    print_table([], ["batch"], "prefill")
    assert capsys.readouterr().out == "\n## prefill\n(no rows)\n"


def test_step_summary_prints_every_table(capsys):
    from scripts.bench_step import summarize

    head = {"gpu": "H200", "torch": "2.x", "ceilings": {"copy_gbs": 4000.0}}
    summarize({**head, "decode": [{"ctx": 1024, "batch": 8, "floor_ms": 0.5, "full_ms": 0.75}],
               "prefill": [{"tokens": 512, "eager_ms": 3.0, "piecewise_path": "piecewise"}],
               "generate": {"requests": 128, "out_tok_s": 9000.0}})
    out = capsys.readouterr().out
    assert "GPU H200, torch 2.x" in out and "## decode step (ms)" in out
    assert "1024 | 8     | 0.5" in out and "0.75" in out and "piecewise" in out
    assert "## generate" in out and "requests | out_tok_s" in out and "9000" in out
    summarize(head)  # nothing measured: each table says so, and no generate table
    out = capsys.readouterr().out
    assert out.count("(no rows)") == 3 and "## generate" not in out


def test_step_plot_writes_a_png(tmp_path):
    """The plot the README shows (matplotlib is a dev dependency: this runs in CI)."""
    from scripts.bench_step import plot

    rows = [{"ctx": ctx, "batch": b, "eager_ms": 1.0 + b, "full_ms": 0.5 + b,
             "floor_ms": 0.1 * b} for ctx in (1024, 4096) for b in (1, 8, 32)]
    path = tmp_path / "decode_step.png"
    plot(rows, path, "CPU")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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


def test_bench_tp_options_and_its_launch_check(monkeypatch):
    """`bench tp` takes its own options through bench.py, and run alone outside torchrun it
    says how to launch it before any GPU work."""
    import scripts.bench_tp as bench_tp

    args, routed = parse(["tp", "--batches", "1", "8", "--skip-generate", "--out", "x"])
    assert args.what == "tp" and routed == {"tp": ["--batches", "1", "8", "--skip-generate"]}
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit, match="torchrun --nproc-per-node 2 -m scripts.bench tp"):
        bench_tp.run(["--skip-generate"])


def test_bench_precision_compares_where_both_runs_agree():
    """`bench precision`'s accuracy: errors only over the positions both runs reached with the
    same tokens (the first differing token's logits included), the greedy share over all."""
    from types import SimpleNamespace

    from scripts.bench_precision import compare

    g = torch.Generator().manual_seed(0)
    a = [torch.randn(3, 50, generator=g) for _ in range(2)]
    b = [a[0] * 1.01, torch.cat([a[1][:1], torch.randn(2, 50, generator=g)])]
    base = SimpleNamespace(tokens=[[1, 2, 3], [4, 5, 6]], logits=a)
    other = SimpleNamespace(tokens=[[1, 2, 3], [4, 9, 6]], logits=b)
    got = compare(base, other)
    assert got["greedy_equal"] == 5 / 6
    # sequence 0: three positions at 0.01; sequence 1: position 0 exact, position 1 (where the
    # tokens part) far off, position 2 not compared
    assert got["max_rel_err"] > 0.5 and got["median_rel_err"] == pytest.approx(0.01, rel=1e-4)


def test_decode_sweep_axes_only_build_plans_the_decode_takes():
    """The kernel sweep's axes around an FP8-cache plan at 16 heads: decode_fp8.py's kernel in
    float16 and in bf16 products, and the dequantising kernel; every plan they build agrees
    with itself (`mla_decode` refuses f16 without group_scores), and the labels tell them
    apart."""
    from dataclasses import replace

    from mla_func.kernels.attention.decode_plan import plan_decode
    from scripts.bench_kernels import sweep_axes
    from scripts.bench_kernels_timing import plan_label

    default = plan_decode(128, 4096, 132, 16, fp8=True)
    kernels = sweep_axes(16, default.num_splits, 4096, fp8=True)[-1]
    plans = [replace(default, **fields) for fields in kernels]
    assert [(p.group_scores, p.f16) for p in plans] == [(True, True), (True, False),
                                                        (False, False)]
    assert all(p.fp8 and (p.group_scores or not p.f16) for p in plans)
    assert len({plan_label(p) for p in plans}) == 3
    # a bf16 cache's sweep never sets the FP8 kernels' fields
    assert not any("group_scores" in f or "f16" in f for axis in sweep_axes(16, 2, 4096)
                   for f in axis)
