"""scripts/check_shapes.py: one mixed meta-device step passes under checks for tiny and v2-lite;
a grown axis fails naming the function, the dimension and both sizes.

The script installs the import hook itself, so end to end it runs in fresh subprocesses (two,
started together: each spends most of its time importing torch); more failure cases run
in-process through `check_shapes.check`, under the hook pytest installs for mla_func."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_shapes.py"
RUNS = {
    "pass": ["--preset", "tiny", "v2-lite"],
    "break qk_rope": ["--preset", "tiny", "--break", "qk_rope"],
}


@pytest.fixture(scope="module")
def results():
    procs = {name: subprocess.Popen([sys.executable, str(SCRIPT), *args],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, args in RUNS.items()}
    return {name: (p.communicate(timeout=600)[0], p.returncode) for name, p in procs.items()}


def test_mixed_step_passes(results):
    out, code = results["pass"]
    assert code == 0, out
    assert "preset tiny: mixed step" in out and "preset v2-lite: mixed step" in out
    assert "3 decodes" in out and "on meta" in out
    for fn in ("mla_func.model.forward", "mla_func.batch.Batch.__init__",
               "mla_func.params.Params.__init__", "mla_func.model.project_qkv_a",
               "mla_func.attention.attend"):
        assert fn in out, fn
    for preset in ("tiny", "v2-lite"):
        assert f"OK {preset}: " in out and "no memory" in out


def test_grown_axis_fails_inside_the_model(results):
    out, code = results["break qk_rope"]
    assert code == 1, out
    assert "params.rope_inv_freq axis qk_rope grown 8 -> 9" in out
    assert "FAIL mla_func.attention.op_args: dimension 'qk_rope'" in out
    assert "`inv_freq` axis 0 has size 9" in out and "qk_rope=8" in out


@pytest.fixture(scope="module")
def check_shapes():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import check_shapes
    finally:
        sys.path.pop(0)
    return check_shapes


@pytest.mark.parametrize("dim,where", [
    ("tokens", "mla_func.batch.Batch.__init__"),
    ("hidden", "mla_func.params.Params.__init__"),
])
def test_grown_axis_fails_in_a_dataclass(check_shapes, capsys, dim, where):
    assert check_shapes.check("tiny", dim) == 1
    out = capsys.readouterr().out
    assert f"FAIL {where}: dimension '{dim}'" in out, out
    size = {"tokens": 44, "hidden": 64}[dim]
    assert f"has size {size}" in out and f"{dim}={size + 1}" in out


def test_explain_names_dim_and_sizes(check_shapes):
    import torch
    from jaxtyping import Float
    from torch import Tensor

    def f(x: Float[Tensor, "tokens hidden"], w: Float[Tensor, " hidden"]
          ) -> Float[Tensor, "tokens hidden"]:
        return x * w

    why = check_shapes.explain(f, {"x": torch.zeros(3, 4), "w": torch.zeros(5)})
    assert why == "dimension 'hidden': `w` axis 0 has size 5, but `x` axis 1 bound hidden=4"
    assert check_shapes.explain(f, {"x": torch.zeros(3, 4), "w": torch.zeros(4)}) is None
    rank = check_shapes.explain(f, {"x": torch.zeros(3), "w": torch.zeros(4)})
    assert "has 1 axes" in rank
    out = check_shapes.explain(f, {"x": torch.zeros(3, 4), "w": torch.zeros(4)},
                               torch.zeros(2, 4), True)
    assert out.startswith("dimension 'tokens': the return value axis 0 has size 2")


def test_unknown_preset_is_an_argument_error(capsys):
    from scripts.check_shapes import main

    with pytest.raises(SystemExit) as info:
        main(["--preset", "tiny", "bogus"])  # refused before tiny runs
    assert info.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err
