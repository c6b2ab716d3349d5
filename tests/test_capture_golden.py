"""The tiny preset's plan is kept in graphs/tiny/ as a golden file: regenerate and compare.

If this fails after an intended change (model, tracer, compiler), regenerate with
`python scripts/capture.py --preset tiny --plan-only --out graphs/tiny` and review the diff in
git (without --out the script writes out/tiny, not the golden). The
"environment" field (versions) is never compared, nor source line numbers (the model files
change under it); with another torch minor version than the golden's, only the
version-independent part is (op-level code may differ between versions).
"""

import json
import os
import re

import torch

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "graphs", "tiny")
STABLE = ("format", "function", "preset", "config_digest", "dims", "dynamic_dims", "leaves",
          "padding", "host_leaves", "full_graph_support", "modes")


def _norm(value: object) -> object:
    """Source positions `file.py:123` -> `file.py:N`."""
    return json.loads(re.sub(r"(\.py):\d+", r"\1:N", json.dumps(value)))


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_golden_tiny_plan(tmp_path):
    from mla_func.capture.artifacts import save_plan
    from scripts.capture import build_plan

    paths = save_plan(build_plan("tiny"), str(tmp_path))
    with open(os.path.join(GOLDEN, "plan.json")) as f:
        golden = json.load(f)
    with open(paths[0]) as f:
        fresh = json.load(f)
    same_torch = _minor(golden["environment"]["torch"]) == _minor(torch.__version__)
    keys = [k for k in golden if k != "environment"] if same_torch else list(STABLE)
    for key in keys:
        assert _norm(fresh.get(key)) == _norm(golden.get(key)), f"plan.json {key!r} changed"
    assert [len(s["inputs"]) for s in fresh["segments"]] == [
        len(s["inputs"]) for s in golden["segments"]]
    if same_torch:
        names = sorted(os.listdir(GOLDEN))
        assert sorted(os.path.basename(p) for p in paths) == [
            n for n in names if n.startswith(("plan", "segment_"))]
        for p in paths[1:]:
            with open(p) as f, open(os.path.join(GOLDEN, os.path.basename(p))) as g:
                assert _norm(f.read()) == _norm(g.read()), f"{os.path.basename(p)} changed"


def test_capture_script_rejects_bad_arguments_and_clears_stale_artifacts(tmp_path, capsys):
    import pytest

    from scripts.capture import main

    for bad in (["--max-tokens", "0"], ["--max-seqs", "-3"], ["--check", "1,x"],
                ["--mode", "bogus"], ["--backend", "flash"]):
        with pytest.raises(SystemExit) as info:
            main(["--plan-only", "--out", str(tmp_path), *bad])
        assert info.value.code == 2, bad
        assert f"argument {bad[0]}:" in capsys.readouterr().err  # names the flag
    assert not os.listdir(tmp_path)  # nothing written on a bad command line
    # A reused --out: an earlier plan's extra segment does not survive; a GPU run's report and
    # dump are not this plan's, so they are moved aside, never deleted.
    for stale in ("segment_09.py", "graph.dot", "capture_report.json"):
        (tmp_path / stale).write_text("old")
    assert main(["--plan-only", "--out", str(tmp_path)]) == 0
    assert sorted(os.listdir(tmp_path)) == [
        "capture_report.prev.json", "graph.prev.dot", "plan.json", "segment_00.py",
        "segment_01.py", "segment_02.py", "segment_03.py"]
