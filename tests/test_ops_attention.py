"""ops.attention's MHA form (the torch backend's long-prompt path): chunked, one sequence at a
time, it equals the definition row by row on fresh random inputs, and its memory grows
linearly with the prompt (`pytest -m cuda`)."""

import pytest
import torch
from mla_helpers import SMALL, make_problem, ref_args

from mla_func.ops import attention as ref


def by_definition(p: dict) -> torch.Tensor:
    """Each row against its own sequence's keys 0..position, expanded for that row alone."""
    kv_lora = p["w_uk"].shape[-1]
    kv = p["cache"][p["page_table"].long()].flatten(1, 2).float()
    w_uk, w_uv = p["w_uk"].float(), p["w_uv"].float()
    rows = []
    for t, (s, pos) in enumerate(zip(p["token_seq"].tolist(), p["positions"].tolist(),
                                     strict=True)):
        c, k_pe = kv[s, : pos + 1, :kv_lora], kv[s, : pos + 1, kv_lora:]
        k = torch.einsum("sc,hnc->hsn", c, w_uk)
        v = torch.einsum("sc,hvc->hsv", c, w_uv)
        scores = (torch.einsum("hn,hsn->hs", p["q_nope"][t].float(), k)
                  + torch.einsum("hr,sr->hs", p["q_pe"][t].float(), k_pe))
        rows.append(torch.einsum("hs,hsv->hv", (scores * p["scale"]).softmax(-1), v))
    return torch.stack(rows)


def with_padding(p: dict, rows: int) -> dict:
    """`p` with `rows` padded rows at the end (sequence 0, position 0, as a padded batch
    has): sequence 0's rows then come in two runs."""
    q = dict(p)
    for name, value in (("q_nope", 0.5), ("q_pe", 0.5), ("token_seq", 0), ("positions", 0)):
        pad = torch.full((rows, *p[name].shape[1:]), value, dtype=p[name].dtype)
        q[name] = torch.cat((p[name], pad))
    return q


@pytest.mark.parametrize("chunk", [1, 7, 16, 256])
def test_mha_in_chunks_equals_the_definition(chunk):
    """A decode, a 37-token chunk after an 11-token prefix already in the cache, a fresh
    23-token prompt and 3 padded rows: chunk boundaries fall inside sequences (7 and 16 do
    not divide their row counts) and at their ends."""
    p = with_padding(make_problem([20, 11, 0], [1, 37, 23], 4, SMALL, device="cpu", seed=5), 3)
    assert ref.sequence_runs(p["token_seq"]) == [(0, 0, 1), (1, 1, 37), (2, 38, 23),
                                                 (0, 61, 3)]
    want = by_definition(p)
    got = ref.attend_mha(*ref_args(p), chunk=chunk)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    whole = ref.attend_mha(*ref_args(p), chunk=len(want))
    torch.testing.assert_close(got, whole, rtol=1e-6, atol=1e-6)
    # The absorbed form is the same function.
    torch.testing.assert_close(ref.attend_absorbed(*ref_args(p)), want, rtol=1e-4, atol=1e-4)


def test_mha_keeps_the_input_dtype():
    p = make_problem([5], [70], 16, SMALL, device="cpu", dtype=torch.bfloat16, seed=2)
    got = ref.attend_mha(*ref_args(p), chunk=32)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), by_definition(p), rtol=2e-2, atol=2e-2)


@pytest.mark.cuda
def test_mha_memory_grows_linearly_with_the_prompt():
    """128 heads with V3's head dims, a 3000-token prompt: the expanded keys and values of the
    sequence (0.4 GiB) and the scores of 256 rows (0.4 GiB, a few copies) at most, where a
    per-row gather of the expanded keys took 47 GiB."""
    dims = {"heads": 128, "nope": 128, "rope": 64, "v": 128, "kv_lora": 512}
    p = make_problem([0], [3000], 64, dims, device="cuda", seed=1)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = ref.attend_mha(*ref_args(p))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert out.shape == (3000, 128, 128) and torch.isfinite(out).all()
    assert peak < 3 * 2**30, f"{peak / 2**30:.2f} GiB"
    # Twice the keys (the prompt after as long a prefix): about twice the memory.
    q = make_problem([3000], [3000], 64, dims, device="cuda", seed=2)
    del out
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    ref.attend_mha(*ref_args(q))
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < 2.5 * peak


_PEAK = """
import resource, sys, torch
sys.path.insert(0, {tests!r})
from mla_helpers import make_problem, ref_args
from mla_func.ops import attention as ref
torch.set_num_threads(1)
dims = {{"heads": 16, "nope": 128, "rope": 64, "v": 128, "kv_lora": 512}}
p = make_problem([{prefix}], [{prompt}], 64, dims, device="cpu", seed=1)
args = ref_args(p)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ref.attend_mha(*args)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def _peak_kib(prefix: int, prompt: int) -> int:
    """The growth of a fresh process's peak memory (KiB) while `attend_mha` runs a prompt of
    `prompt` tokens after `prefix` cached ones, 16 heads of V3's head dims, on the CPU."""
    import subprocess
    import sys
    from pathlib import Path

    code = _PEAK.format(tests=str(Path(__file__).parent), prefix=prefix, prompt=prompt)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    return int(run.stdout.split()[-1])


def test_mha_memory_grows_linearly_on_the_cpu():
    """The CPU twin of the GPU test below, at 16 heads: a 2000-token prompt's expanded keys
    and values and 256 rows of scores (0.19 GiB measured) at most, and twice the keys (the prompt
    after as long a prefix) about twice that, not four times (a per-row gather of the
    expanded keys, the old form, took about 6 GiB here)."""
    one = _peak_kib(0, 2000)
    assert one < 0.5 * 2**20, f"{one / 2**20:.2f} GiB"
    assert _peak_kib(2000, 2000) < 2.5 * max(one, 64 * 2**10)
