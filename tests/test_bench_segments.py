"""scripts/bench_segments.py (Inductor segments against plain ones): its command line through
scripts/bench.py, and its rows from a CPU run of the tiny preset (capture emulated, host
timing; the plain kind alone: the Inductor path's own test is test_capture_segments.py)."""

import pytest
import torch

from scripts.bench import parse


def test_options_reach_the_segments_benchmark(tmp_path):
    from scripts.bench_segments import _parse

    args, routed = parse(["segments", "--out", str(tmp_path), "--segments", "inductor",
                          "--max-tokens", "256", "--rounds", "5"])
    assert args.what == "segments" and list(routed) == ["segments"]
    got = vars(_parse(routed["segments"]))
    assert (got["segments"], got["max_tokens"], got["rounds"]) == ("inductor", 256, 5)
    assert "segments" not in parse(["all", "--out", str(tmp_path)])[1]
    with pytest.raises(SystemExit):
        _parse(["--segment", "plain"])  # exact names only


def test_without_cuda_it_says_so():
    from scripts.bench_segments import run

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        run([])


def test_cpu_rows_time_each_kind_against_eager(capsys):
    from scripts.bench_segments import run

    rows = run(["--preset", "tiny", "--backend", "torch", "--segments", "plain",
                "--batches", "1,3", "--prefill", "5", "--ctx", "6", "--page-size", "4",
                "--max-tokens", "8", "--reps", "1", "--rounds", "2"], device="cpu")
    assert [r["what"] for r in rows] == ["capture", "decode", "decode", "prefill"]
    assert rows[0]["segments"] == "plain" and rows[0]["graphs"] > 0
    for r in rows[1:]:
        assert r["dispatch"] == "piecewise" and r["eager_ms"] > 0 and r["plain_ms"] > 0
        assert r["plain_max_diff"] < 1e-4
    assert [r["bucket"] for r in rows[1:]] == [1, 4, 8]
    assert "piecewise step time, tiny" in capsys.readouterr().out
