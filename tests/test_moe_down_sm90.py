"""The persistent Gluon down GEMM of the MoE (kernels/moe_down_sm90.py, `MoEConfig.sm90_down`):
its sm90 ahead-of-time compile, the configs it refuses and, off sm90, the Triton kernel in its
place (no GPU needed); on an sm90 GPU (`pytest -m cuda`) the Triton down kernel's bits at real
sizes, eagerly and replayed. Gluon has no interpreter."""

import dataclasses

import pytest
import torch
from moe_helpers import make, reference
from sm90_ptxas import run_compile_script

from mla_func.kernels import moe_down_sm90
from mla_func.kernels.fused_moe import fused_experts
from mla_func.kernels.moe_config import MoEConfig

_SM90 = r"""
import re, torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
from sm90_ptxas import ptxas_usage
from mla_func.kernels import moe_down_sm90 as g

bf, i32 = torch.bfloat16, torch.int32
for hidden, inter, experts, bn, bk, stages in (
        (2048, 1408, 64, 256, 64, 4), (2048, 1408, 64, 256, 64, 3), (7168, 2048, 256, 256, 64, 4),
        (2048, 1408, 64, 128, 64, 4)):
    tiles, tokens, topk = 300, 4096, 6
    grid, args, kwargs = g.down_launch(
        torch.empty(tiles * 128, inter, dtype=bf), torch.empty(experts, hidden, inter, dtype=bf),
        torch.empty(tokens * topk, hidden, dtype=bf), torch.empty(tokens, topk),
        torch.empty(tiles * 128, dtype=i32), torch.empty(tiles, dtype=i32),
        torch.empty(tiles, dtype=i32), topk, bn, bk, stages, 132)
    assert grid == (132,)
    opts = {"num_warps": kwargs.pop("num_warps")}
    kern = g._down_kernel
    sig, attrs = {}, {}
    for i, (name, v) in enumerate(zip(kern.arg_names, args + tuple(kwargs.values()))):
        if name in kwargs:
            sig[name] = "constexpr"
        elif isinstance(v, int):
            sig[name] = "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = mangle_type(v)
            if torch.is_tensor(v):
                attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(GluonASTSource(kern, sig, kwargs, attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    regs, spills, report = ptxas_usage(k)
    ptx = k.asm["ptx"]
    print(hidden, bn, stages, "regs", regs, "spills", spills, "smem", k.metadata.shared)
    assert spills == 0, report
    assert k.metadata.shared <= 232448  # sm90's shared memory per block
    # One wgmma shape, n = the N-tile; the two TMA loads of a step, issued in the prologue
    # (STAGES - 1 steps, unrolled) and in the loop.
    assert set(re.findall(r"wgmma.mma_async.sync.aligned.(m\d+n\d+k\d+)", ptx)) == {
        f"m64n{bn}k16"}
    assert len(re.findall(r"cp.async.bulk.tensor", ptx)) == 2 * stages
    assert "mbarrier.try_wait" in ptx
"""


def test_sm90_down_compiles_for_sm90():
    """Ahead-of-time sm90 compile of V2-Lite's and V3's shapes at the table's tile and two
    others: no spills, within sm90's shared memory, wgmma at the N-tile, TMA loads."""
    out = run_compile_script(_SM90, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


_SHAPE = dict(topk=2, n_exp=4, hidden=64, inter=64, shared=1)
_WHOLE = MoEConfig(128, (32, 32, 4, 2), (32, 32, 4, 2), fuse_shared=False)


@pytest.mark.parametrize("bad", [
    dict(halves=True), dict(block_m=64), dict(fuse_shared=True),
    dict(direct=True, block_m=16)])
def test_sm90_down_refuses_other_layouts(bad):
    """Half tiles, another M-tile, folded shared experts and the direct layout: a ValueError
    that names the flag, on any device."""
    x, w, ids, gu, dn, mlp = make(3, **_SHAPE)
    cfg = dataclasses.replace(_WHOLE, sm90_down=True, **bad)
    with pytest.raises(ValueError, match="sm90_down"):
        fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg)


def test_sm90_down_off_sm90_runs_the_triton_kernel():
    """Off an sm90 device (here the interpreter) the flag changes nothing: the Triton down
    kernel's bits."""
    assert not moe_down_sm90.device_ok(torch.device("cpu"))
    x, w, ids, gu, dn, mlp = make(20, **_SHAPE, seed=1)
    got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down,
                        dataclasses.replace(_WHOLE, sm90_down=True))
    assert torch.equal(got, fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, _WHOLE))


# ---- GPU: real sizes, bf16 ------------------------------------------------------------------

V2_LITE = dict(topk=6, n_exp=64, hidden=2048, inter=1408, shared=2)
V3 = dict(topk=8, n_exp=256, hidden=7168, inter=2048, shared=1)
_TREE = MoEConfig(128, (128, 64, 8, 4), (256, 64, 8, 4), fuse_shared=False, tma=True)


def _sm90() -> None:
    if not moe_down_sm90.device_ok(torch.device("cuda")):
        pytest.skip("the kernel runs on sm90 only")


@pytest.mark.cuda
@pytest.mark.parametrize("shape,tokens", [
    (V2_LITE, 1), (V2_LITE, 300), (V2_LITE, 2048), (V2_LITE, 4096), (V2_LITE, 8192),
    (V3, 512)], ids=["v2lite-1", "v2lite-300", "v2lite-2048", "v2lite-4096", "v2lite-8192",
                     "v3-512"])
@pytest.mark.parametrize("skew", [False, True])
def test_cuda_sm90_down_matches_triton(shape, tokens, skew):
    """The reference's result, and the bits of the Triton down kernel on the same tiles (the
    same K steps, each a chain of k16 wgmmas in order), with every token's first choice one
    expert (skew) and with experts that get no token (1 token)."""
    _sm90()
    torch.cuda.empty_cache()
    x, w, ids, gu, dn, mlp = make(tokens, **shape, dtype=torch.bfloat16, device="cuda",
                                  skew=skew)
    got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down,
                        dataclasses.replace(_TREE, sm90_down=True))
    want = reference(x, w, ids, gu, dn, mlp)
    assert ((got.float() - want.float()).norm() / want.float().norm()) < 2e-2
    assert torch.equal(got, fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, _TREE))


@pytest.mark.cuda
def test_cuda_sm90_down_graph_replay_matches_eager():
    """Captured once, replayed on fresh routing: each replay gives the eager call's bits (the
    programs count the tiles on the device)."""
    _sm90()
    cfg = dataclasses.replace(_TREE, sm90_down=True)
    x, w, ids, gu, dn, mlp = make(4096, **V2_LITE, dtype=torch.bfloat16, device="cuda")
    static = [t.clone() for t in (x, w, ids)]

    def run(*a):
        return fused_experts(*a, gu, dn, mlp.gate_up, mlp.down, cfg)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run(*static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(*static)
    for seed, skew in ((3, False), (4, True)):
        fresh = make(4096, **V2_LITE, dtype=torch.bfloat16, device="cuda", seed=seed,
                     skew=skew)[:3]
        for dst, src in zip(static, fresh, strict=True):
            dst.copy_(src)
        graph.replay()
        torch.testing.assert_close(out, run(*fresh), rtol=0, atol=0)
