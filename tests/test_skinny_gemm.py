"""The skinny GEMM (kernels/skinny_gemm.py) vs `x @ w.T` on fresh random inputs.

CPU: the kernel runs interpreted (conftest sets TRITON_INTERPRET) in float32 (the
interpreter's bfloat16 dot is unreliable), with small tiles so split-K and the K tail are
exercised; the reference is float64. GPU (`cuda`): V2-Lite's projection shapes in bfloat16,
and CUDA-graph replay equal to eager bitwise.
"""

import os
import subprocess
import sys

import pytest
import torch

from mla_func.kernels.skinny_gemm import (
    MAX_TOKENS,
    TARGET_PROGRAMS,
    SkinnyConfig,
    launch,
    linear,
    pick_config,
)

# (n, k) of V2-Lite's dense projections: q, kv_a, o, shared gate_up / down, dense gate_up /
# down, lm_head.
V2_LITE = [(3072, 2048), (576, 2048), (2048, 2048), (5632, 2048), (2048, 2816),
           (21888, 2048), (2048, 10944), (102400, 2048)]


def _cfg(m, k, split):
    k_blocks = -(-k // 32)
    per = -(-k_blocks // 3) if split else k_blocks
    return SkinnyConfig(max(16, 1 << (m - 1).bit_length()), 32, 32, -(-k_blocks // per), per,
                        num_stages=2)


@pytest.fixture
def poison(monkeypatch):
    """Outputs and partials start as NaN, so an element the kernel skips fails the check."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))


def _check(y, x, w, tol):
    ref = x.double() @ w.double().T
    err = (y.double() - ref).abs().max() / ref.abs().max()
    assert err < tol, err


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("k", [32, 160, 256])
@pytest.mark.parametrize("n", [8, 96, 200])
@pytest.mark.parametrize("m", [1, 3, 16, 64])
def test_matches_torch_interpreted(m, n, k, split, poison):
    x, w = torch.randn(m, k), torch.randn(n, k)
    cfg = _cfg(m, k, split)
    assert split == (cfg.splits > 1) or k == 32
    y = launch(x, w, cfg)
    assert y.shape == (m, n) and y.dtype == x.dtype
    _check(y, x, w, 1e-5)


def test_two_runs_bitwise_equal(poison):
    x, w = torch.randn(5, 160), torch.randn(96, 160)
    cfg = _cfg(5, 160, True)
    assert launch(x, w, cfg).equal(launch(x, w, cfg))


def test_table_config_interpreted(poison):
    """The table's own tiles (128-wide K, split-K, K tail) at a small shape."""
    x, w = torch.randn(2, 400), torch.randn(40, 400)
    assert pick_config(2, 40, 400).splits > 1
    y = launch(x, w)
    assert not y.isnan().any()
    _check(y, x, w, 1e-5)


def test_table_fills_the_machine_and_covers_k():
    for n, k in V2_LITE:
        for m in (1, 8, 32, 64):
            c = pick_config(m, n, k)
            k_blocks = -(-k // c.block_k)
            assert m <= c.block_m and 32 <= c.block_n <= 128 and 128 <= c.block_k <= 256
            assert (c.splits - 1) * c.k_blocks_per_split < k_blocks <= (
                c.splits * c.k_blocks_per_split)
            programs = -(-n // c.block_n) * c.splits
            assert c.splits == 1 or programs <= 2 * TARGET_PROGRAMS + -(-n // c.block_n)
            assert c.splits * m * 4 <= k * 2 / 4 or c.splits == 1  # partials stay small


def test_op_picks_kernel_or_cublas_and_traces_symbolically():
    from torch.fx.experimental.proxy_tensor import make_fx

    w = torch.randn(96, 160)
    for m in (2, MAX_TOKENS + 1):  # kernel (interpreted) and the F.linear fallback
        x = torch.randn(m, 160)
        _check(linear(x, w), x, w, 1e-5)
    gm = make_fx(linear, tracing_mode="symbolic")(torch.randn(5, 160), w)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls] == [torch.ops.mla_func.skinny_linear.default]
    assert not isinstance(calls[0].meta["val"].shape[0], int)  # tokens stays symbolic


_AOT = """
import re, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from mla_func.kernels.skinny_gemm import _skinny_kernel, pick_config
shapes = %r
seen = set()
for n, k in shapes:
    for m in (1, 8, 32, 64):
        c = pick_config(m, n, k)
        key = (c.block_m, c.block_n, c.block_k, c.splits > 1, k %% c.block_k == 0)
        if key in seen:
            continue
        seen.add(key)
        out_t = "*fp32" if c.splits > 1 else "*bf16"
        sig = dict(x_ptr="*bf16", w_ptr="*bf16", out_ptr=out_t, M="i32", N="i32", K="i32",
                   K_BLOCKS_PER_SPLIT="i32")
        const = dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                     EVEN_K=key[4], PARTIAL=key[3])
        sig.update({name: "constexpr" for name in const})
        # As at run time: pointers and K (a multiple of 16) specialised as 16-divisible.
        attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 5)}
        kernel = triton.compile(
            triton.compiler.ASTSource(fn=_skinny_kernel, signature=sig, constexprs=const,
                                      attrs=attrs),
            target=GPUTarget("cuda", 90, 32),
            options=dict(num_warps=c.num_warps, num_stages=c.num_stages))
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(kernel.asm["ptx"])
            f.flush()
            out = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", f.name,
                                  "-o", f.name + ".cubin"], capture_output=True, text=True)
        regs = int(re.search(r"Used (\\d+) registers", out.stderr).group(1))
        spills = int(re.search(r"(\\d+) bytes spill stores", out.stderr).group(1))
        smem = kernel.metadata.shared
        ptx = kernel.asm["ptx"]
        vec = "ld.global.v4" in ptx or "cp.async.cg.shared.global" in ptx  # 16-byte loads
        print(key, "regs", regs, "spills", spills, "smem", smem, "16B loads", vec)
        assert spills == 0 and smem <= 227 * 1024 and vec, out.stderr
"""


def test_compiles_for_sm90_without_spills():
    """Ahead-of-time sm90 compile (no GPU needed) of every config the table picks."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", _AOT % (V2_LITE,)], env=env,
                         capture_output=True, text=True, timeout=300)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 8, 32, 64])
@pytest.mark.parametrize("n,k", V2_LITE)
def test_v2_lite_shapes_on_gpu(n, k, m):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    y = linear(x, w)
    ref = x.double() @ w.double().T
    # bf16 output rounding (2^-8 relative) plus fp32 accumulation order.
    err = (y.double() - ref).abs().max() / ref.abs().max()
    assert y.dtype == torch.bfloat16 and err < 1e-2, err
    assert (y.double() - ref).norm() / ref.norm() < 4e-3


@pytest.mark.cuda
@pytest.mark.parametrize("n,k", [(576, 2048), (2048, 10944), (102400, 2048)])
def test_cuda_graph_replay_equals_eager_bitwise(n, k):
    x = torch.randn(8, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    eager = linear(x, w)  # warm-up: compiles
    assert linear(x, w).equal(eager)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear(x, w)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert out.equal(linear(x, w))
