"""The scripts' command lines on a CPU: what the user gets wrong ends in one line (argparse's
usage error, or `error: ...`) and a non-zero status before any expensive work, never in a
traceback; capture.py leaves the golden plan and an earlier GPU run's report alone.

scripts/capture.py, scripts/profile_generate.py, scripts/profile_step.py, scripts/generate.py,
each called through its `main(argv)`.
"""

import os

import pytest
import torch

import mla_func as mf

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
GPU_ARTIFACTS = {"capture_report.json": "old report", "graph.dot": "old dot"}


def one_line_error(err: str) -> bool:
    return err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def usage_error(info: pytest.ExceptionInfo, err: str, flag: str) -> bool:
    return info.value.code == 2 and f"argument {flag}:" in err and "Traceback" not in err


def write_gpu_artifacts(directory) -> None:
    for name, text in GPU_ARTIFACTS.items():
        (directory / name).write_text(text)


def refuse(*_, **__):
    raise AssertionError("reached work that the command line should have stopped before")


# scripts/capture.py


def test_capture_default_out_leaves_the_golden_plan_alone(tmp_path, monkeypatch, capsys):
    """Trying flags without --out writes out/PRESET, not graphs/PRESET (the golden)."""
    from scripts.capture import main

    monkeypatch.chdir(tmp_path)
    golden = tmp_path / "graphs" / "tiny"
    golden.mkdir(parents=True)
    (golden / "plan.json").write_text("golden")
    assert main(["--plan-only", "--max-tokens", "64"]) == 0
    assert (golden / "plan.json").read_text() == "golden" and os.listdir(golden) == ["plan.json"]
    assert (tmp_path / "out" / "tiny" / "plan.json").is_file()
    assert "-> out/tiny/plan.json" in capsys.readouterr().out


@NO_CUDA
def test_capture_without_cuda_plans_and_moves_a_gpu_report_aside(tmp_path, capsys):
    """README's command on a CPU: the plan, exit 0; an earlier GPU run's report and dump are
    not this plan's, so they move to .prev names (kept: a GPU report is expensive)."""
    from scripts.capture import main

    write_gpu_artifacts(tmp_path)
    assert main(["--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "no CUDA device: plan only (nothing captured)" in captured.err
    assert "planning tiny (3 layers" in captured.out  # said before the seconds of planning
    assert "moved the previous run's capture_report.json, graph.dot aside" in captured.out
    assert main(["--out", str(tmp_path), "--check", "1,8"]) == 0  # a GPU option: said unused
    assert "plan only (nothing captured, --check not run)" in capsys.readouterr().err
    assert (tmp_path / "capture_report.prev.json").read_text() == "old report"
    assert (tmp_path / "graph.prev.dot").read_text() == "old dot"
    assert not (tmp_path / "capture_report.json").exists() and not (tmp_path / "graph.dot").exists()
    assert (tmp_path / "plan.json").is_file()


def test_capture_failed_run_keeps_the_gpu_report(tmp_path, monkeypatch, capsys):
    """A run that fails (here the tracer's CaptureError) leaves the report and dump in place,
    and says why in one line."""
    import scripts.capture as capture
    from mla_func.capture import CaptureError

    def fail(*_, **__):
        raise CaptureError("traced badly")

    write_gpu_artifacts(tmp_path)
    monkeypatch.setattr(capture, "build_plan", fail)
    assert capture.main(["--plan-only", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: traced badly\n"
    assert sorted(os.listdir(tmp_path)) == sorted(GPU_ARTIFACTS)
    for name, text in GPU_ARTIFACTS.items():
        assert (tmp_path / name).read_text() == text


def test_capture_more_seqs_than_tokens_is_one_line(tmp_path, capsys):
    from scripts.capture import main

    write_gpu_artifacts(tmp_path)
    assert main(["--plan-only", "--out", str(tmp_path), "--max-tokens", "8",
                 "--max-seqs", "9"]) == 2
    err = capsys.readouterr().err
    # In the command line's words, not the package's (`max_seqs=9`).
    assert one_line_error(err) and "--max-seqs 9 is more than --max-tokens 8" in err
    assert "pass --max-seqs <= --max-tokens" in err
    assert sorted(os.listdir(tmp_path)) == sorted(GPU_ARTIFACTS)


@pytest.mark.parametrize("flag, value", [("--max-tokens", "0"), ("--max-seqs", "-1")])
def test_capture_rejects_sizes_below_one(flag, value, tmp_path, monkeypatch, capsys):
    import scripts.capture as capture

    monkeypatch.setattr(capture, "build_plan", refuse)
    with pytest.raises(SystemExit) as info:
        capture.main(["--plan-only", "--out", str(tmp_path), flag, value])
    err = capsys.readouterr().err
    assert usage_error(info, err, flag) and "must be at least 1" in err
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("tokens, seqs", [(1, None), (2, 2), (16, 1)])
def test_capture_plans_the_smallest_ranges(tokens, seqs, tmp_path):
    """Ranges too small for a prime example size of their own (max 1, or both dims at 2)
    still plan: the tracer takes a larger example size, and the buckets stop at the range."""
    from scripts.capture import build_plan, main

    argv = ["--plan-only", "--out", str(tmp_path), "--max-tokens", str(tokens)]
    assert main(argv + (["--max-seqs", str(seqs)] if seqs else [])) == 0
    plan = build_plan("tiny", max_tokens=tokens, max_seqs=seqs)
    assert plan.buckets["piecewise"][-1] == tokens
    assert plan.buckets["full"][-1] == (seqs or tokens)


@pytest.mark.parametrize("where", ["file", "file/sub"])
def test_capture_rejects_an_out_it_cannot_create_before_planning(where, tmp_path, monkeypatch,
                                                                 capsys):
    import scripts.capture as capture

    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setattr(capture, "build_plan", refuse)
    with pytest.raises(SystemExit) as info:
        capture.main(["--plan-only", "--out", str(tmp_path / where)])
    err = capsys.readouterr().err
    assert usage_error(info, err, "--out")
    assert "is not a directory" in err or "is a file" in err
    assert (tmp_path / "file").read_text() == "not a directory"


# scripts/profile_generate.py

CPU_PROFILE = ["--preset", "tiny", "--device", "cpu", "--mode", "eager", "--requests", "2",
               "--prompt", "6", "--page-size", "4", "--top", "3"]


def test_profile_generate_one_new_token(capsys):
    """--new 1: the warm-up asks no more new tokens than the engine was sized for."""
    from scripts.profile_generate import main

    assert main([*CPU_PROFILE, "--new", "1", "--timeline"]) == 0
    out = capsys.readouterr().out
    assert "steps, loop" in out and "prefill, eager" in out and "decode, eager" not in out


@pytest.mark.parametrize("flag, value", [
    ("--page-size", "0"), ("--prompt", "-1"), ("--requests", "0"), ("--new", "0"),
    ("--preset", "foo"), ("--mode", "bogus"), ("--backend", "flash"), ("--device", "gpu"),
    ("--max-seq-len", "3")])
def test_profile_generate_rejects_bad_arguments(flag, value, monkeypatch, capsys):
    from scripts.profile_generate import main

    monkeypatch.setattr(mf, "init_params", refuse)
    with pytest.raises(SystemExit) as info:
        main([*CPU_PROFILE, flag, value])
    assert usage_error(info, capsys.readouterr().err, flag)


@NO_CUDA
@pytest.mark.parametrize("argv, words", [
    ([], "--device cuda and --mode full_and_piecewise need a CUDA GPU"),
    (["--preset", "tiny", "--device", "cpu"], "--mode full_and_piecewise needs a CUDA GPU"),
    (["--preset", "tiny", "--mode", "eager"], "--device cuda needs a CUDA GPU")])
def test_profile_generate_without_cuda_fails_before_any_work(argv, words, monkeypatch):
    from scripts.profile_generate import main

    monkeypatch.setattr(mf, "init_params", refuse)
    with pytest.raises(SystemExit, match=words) as info:
        main(argv)
    assert info.value.code not in (0, None)


def test_profile_generate_input_errors_are_one_line(monkeypatch, capsys):
    from mla_func import memory
    from scripts.profile_generate import main

    assert main([*CPU_PROFILE, "--prompt", "5000", "--new", "1"]) == 2  # tiny: 4096 positions
    err = capsys.readouterr().err
    assert one_line_error(err) and "prompt of 5000 tokens" in err
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1024)
    monkeypatch.setattr(mf, "init_params", guard_meta(mf.init_params))
    assert main(CPU_PROFILE) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "1.00 KiB available" in err


# scripts/profile_step.py


@NO_CUDA
def test_profile_step_without_cuda_fails_clearly():
    from scripts.profile_step import main

    with pytest.raises(SystemExit, match="profile_step needs a CUDA GPU") as info:
        main(["--batch", "1"])
    assert info.value.code not in (0, None)


@pytest.mark.parametrize("argv, flag", [
    (["--batch", "0"], "--batch"), (["--batch", "1", "-2"], "--batch"),
    (["--ctx", "-5"], "--ctx"), (["--page-size", "0"], "--page-size"),
    (["--backend", "flash"], "--backend")])
def test_profile_step_rejects_bad_numbers(argv, flag, capsys):
    from scripts.profile_step import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert usage_error(info, capsys.readouterr().err, flag)


# scripts/generate.py


def guard_meta(init_params):
    """`init_params` that refuses to allocate: only the meta device (the estimate) passes."""
    def meta_only(cfg, *args, device="cpu", **kwargs):
        if torch.device(device).type != "meta":
            refuse()
        return init_params(cfg, *args, device=device, **kwargs)
    return meta_only


def test_generate_estimates_parameter_bytes_without_allocating():
    from mla_func.memory import available_bytes
    from mla_func.params import tensor_leaves
    from scripts.generate import param_bytes

    cfg = mf.MLAConfig.preset("tiny")
    real = mf.init_params(cfg, dtype=torch.bfloat16)
    assert param_bytes(cfg, torch.bfloat16) == sum(
        t.numel() * t.element_size() for _, t in tensor_leaves(real))
    assert param_bytes(mf.MLAConfig.preset("v2-lite"), torch.float32) > 50 * 2**30
    # V3 in block FP8 over 8 GPUs: 671 GB of values, one H200's 141 GB holds a rank's share
    v3_fp8 = param_bytes(mf.MLAConfig.preset("v3"), torch.bfloat16, "fp8")
    assert 660e9 < v3_fp8 < 690e9 and v3_fp8 / 8 < 100e9
    free = available_bytes("cpu")
    assert isinstance(free, int) and free > 0


@pytest.mark.parametrize("preset, dtype, free", [
    ("tiny", "float32", 1024), ("v2-lite", "float32", 16 * 2**30),
    ("v3", "bfloat16", 16 * 2**30)])
def test_generate_refuses_weights_larger_than_memory(preset, dtype, free, monkeypatch, capsys):
    """Refused before anything is allocated (the guard makes a real allocation fail the test
    instead of filling this machine's memory), naming both sizes."""
    from mla_func import memory
    from mla_func.dtypes import DTYPES
    from mla_func.memory import human
    from scripts.generate import main, param_bytes

    need = human(param_bytes(mf.MLAConfig.preset(preset), DTYPES[dtype]))
    monkeypatch.setattr(memory, "available_bytes", lambda device: free)
    monkeypatch.setattr(mf, "init_params", guard_meta(mf.init_params))
    assert main(["--preset", preset, "--device", "cpu", "--dtype", dtype]) == 2
    err = capsys.readouterr().err
    assert one_line_error(err)
    assert f"the weights need {need} ({dtype}) but cpu has {human(free)} available" in err


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough "
                 "memory: you tried to allocate 62826496000 bytes.\nmore")])
def test_generate_out_of_memory_is_one_line(error, monkeypatch, capsys):
    import scripts.generate

    def fail(args, tp=None):
        raise error

    monkeypatch.setattr(scripts.generate, "load", fail)
    assert scripts.generate.main(["--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and err.startswith("error: out of memory: ")


def test_generate_other_runtime_errors_keep_their_traceback(monkeypatch):
    import scripts.generate

    def fail(args, tp=None):
        raise RuntimeError("a bug")

    monkeypatch.setattr(scripts.generate, "load", fail)
    with pytest.raises(RuntimeError, match="a bug"):
        scripts.generate.main(["--preset", "tiny"])


def test_generate_with_fp8_weights_and_cache(capsys):
    """`--weights fp8 --kv-dtype fp8` on random weights: quantised, run, and said."""
    from scripts.generate import main

    assert main(["--preset", "tiny", "--device", "cpu", "--prompts", "2", "--max-new-tokens",
                 "2", "--weights", "fp8", "--kv-dtype", "fp8"]) == 0
    assert "fp8 weights, fp8 cache" in capsys.readouterr().out


@pytest.mark.parametrize("module, command", [("generate", "scripts/generate.py"),
                                             ("profile_generate", "-m scripts.profile_generate")])
@pytest.mark.parametrize("world", [None, "3"])
def test_tp_without_as_many_processes_names_the_torchrun_line(module, command, world,
                                                               monkeypatch, capsys):
    """`--tp 2` where torchrun did not start 2 processes (none, or 3) ends at the command line
    with the torchrun line that runs the script on 2; a matching WORLD_SIZE
    passes (`cli.check_ranks`)."""
    import importlib

    script = importlib.import_module(f"scripts.{module}")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if world:
        monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(SystemExit):
        script.parse_args(["--tp", "2"])
    started = world or "1"
    assert (f"argument --tp: 2 processes, {started} started; run torchrun --nproc-per-node 2 "
            f"{command} --tp 2 ...") in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert script.parse_args(["--tp", "2"]).tp == 2
