"""`torch.compile(forward)` with Inductor, the token count dynamic (`capture.interop.mark_dynamic`
from the annotations): one graph serves steps of other sizes and compositions, with the
logits and the cache eager gives. CPU: the tiny preset and a q_lora config (Inductor's C++
backend, ~20 s of compilation each); GPU: the V2-Lite shape, and `mode="reduce-overhead"`
(CUDA graphs under Inductor).

Each case runs in a fresh interpreter (this file as a script): the tests' jaxtyping import
hook wraps every function of the package in a checker that dynamo cannot trace (a graph
break at each call), which a user's process does not have.
"""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

import mla_func as mf
from mla_func.capture.interop import mark_dynamic
from mla_func.donation import ConsumedError

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _prompt(n, seed, vocab=256):
    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _state(cfg, device="cpu", dtype=torch.float32):
    """A state whose sequences 0 and 1 own the same pages in every call (one allocator
    order), so that two states' caches compare row for row."""
    state = mf.init_state(cfg, num_pages=24, page_size=4, device=device, dtype=dtype)
    return state, state.allocator.reserve(0, 40), state.allocator.reserve(1, 40)


def _steps(vocab):
    """(sequence 0's, sequence 1's) new tokens and starts of each step: prompts of several
    sizes, then mixed and decode steps; two sequences each (one would specialise `seqs`)."""
    a, b = _prompt(13, 1, vocab), _prompt(8, 2, vocab)
    return [((a[:5], 0), (b[:3], 0)), ((a[5:12], 5), (b[3:5], 3)),
            ((a[12:13], 12), (b[5:8], 5)), (([3], 13), ([4], 8))]


def _close(got, want, tol, norm_tol):
    """Element-wise within `tol`; with `norm_tol`, the difference's norm relative to `want`'s
    instead (bf16: a value rounded one way or the other differs by an ulp, 0.0625 at 8-16)."""
    if norm_tol is None:
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        return
    rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert rel <= norm_tol, f"relative difference {rel:.3g} > {norm_tol}"


def compiled_equals_eager(cfg, params, device="cpu", dtype=torch.float32, tol=1e-5,
                          norm_tol=None, **compile_kwargs):
    """Steps of the compiled `forward` against eager ones on a second state: logits and the
    cache; after the first step, no recompilation."""
    compiled_state, pa, pb = _state(cfg, device, dtype)
    eager_state, _, _ = _state(cfg, device, dtype)
    max_pages = len(pa)
    step = torch.compile(mf.forward, **compile_kwargs)
    for i, ((ta, sa), (tb, sb)) in enumerate(_steps(cfg.vocab_size)):
        batch = mf.make_batch([mf.SeqWork(ta, sa, pa), mf.SeqWork(tb, sb, pb)], 4, max_pages,
                              device, backend="auto")
        if i == 0:
            mark_dynamic(mf.forward, params, compiled_state, batch)
            spent = compiled_state
        with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=i > 0):
            got, out = step(params, compiled_state, batch)
            want, eager_state = mf.forward(params, eager_state, batch)
        assert out is not compiled_state and out.cache is compiled_state.cache  # donated
        compiled_state = out
        _close(got, want, tol, norm_tol)
        _close(compiled_state.cache, eager_state.cache, tol, norm_tol)
    with pytest.raises(ConsumedError):  # a consumed state, under the compiled step too
        step(params, spent, batch)


def _tiny():
    cfg = mf.MLAConfig.preset("tiny")
    compiled_equals_eager(cfg, mf.init_params(cfg, seed=5))


def _q_lora():
    """q_lora (the query through q_a, its norm and q_b) on two layers, one dense, one MoE."""
    cfg = dataclasses.replace(mf.MLAConfig.preset("tiny"), q_lora_rank=24, num_hidden_layers=2)
    compiled_equals_eager(cfg, mf.init_params(cfg, seed=6))


def _v2_lite(mode: str):
    """The V2-Lite shape (4 of its layers: compile time) in bf16 with the fused kernels and
    the Triton attention; "reduce-overhead" replays it as CUDA graphs."""
    cfg = dataclasses.replace(mf.MLAConfig.preset("v2-lite"), num_hidden_layers=4)
    params = mf.init_params(cfg, seed=7, device="cuda", dtype=torch.bfloat16)
    # bf16: Inductor keeps the glue's intermediates in float32 where eager rounds them, so
    # values land an ulp apart (3 of 221,184 cache values by up to 0.072, logits 0.0105 apart
    # by norm, on an H200): compared by the difference's norm against the model's own bf16
    # noise, 0.021 (bf16 against float32 at this shape, tests/test_parallel_cuda.py).
    compiled_equals_eager(cfg, params, "cuda", torch.bfloat16, norm_tol=0.03, mode=mode)


CASES = {"tiny": _tiny, "q_lora": _q_lora,
         "v2_lite": lambda: _v2_lite("default"),
         "v2_lite_reduce_overhead": lambda: _v2_lite("reduce-overhead")}


def _run(case: str) -> None:
    root = os.path.dirname(TESTS_DIR)
    path = os.pathsep.join(p for p in (root, TESTS_DIR, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, __file__, case], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def test_inductor_tiny_preset_equals_eager():
    _run("tiny")


def test_inductor_q_lora_equals_eager():
    _run("q_lora")


@pytest.mark.cuda
@pytest.mark.parametrize("case", ["v2_lite", "v2_lite_reduce_overhead"])
def test_inductor_v2_lite_shape_on_gpu(case):
    _run(case)


if __name__ == "__main__":
    CASES[sys.argv[1]]()
