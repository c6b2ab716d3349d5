"""Fused element-wise kernels (norm, rope, swiglu) vs the torch reference, fresh random inputs
(CPU: interpreted)."""

import pytest
import torch

import mla_func as mf
from mla_func.kernels.attention.rope import mla_prologue
from mla_func.kernels.linear.norm import add_rmsnorm, rmsnorm
from mla_func.kernels.moe.swiglu import silu_mul, swiglu
from mla_func.ops.mlp import swiglu as swiglu_ref
from mla_func.ops.norm import rmsnorm as rmsnorm_ref
from mla_func.ops.rope import apply_rope, rope_cos_sin
from mla_func.params import yarn_inv_freq

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tol(dtype):
    # The CPU interpreter rounds float32 -> bfloat16 differently in the last bit.
    return dict(rtol=1.6e-2, atol=4e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, width", [(1, 64), (7, 96), (33, 512)])
def test_rmsnorm_and_add_rmsnorm(dtype, rows, width):
    x = torch.randn(rows, width, device=DEVICE, dtype=dtype)
    r = torch.randn(rows, width, device=DEVICE, dtype=dtype)
    w = (1 + 0.1 * torch.randn(width, device=DEVICE)).to(dtype)
    torch.testing.assert_close(rmsnorm(x, w, 1e-6), rmsnorm_ref(x, w, 1e-6), **_tol(dtype))
    h, y = add_rmsnorm(x, r, w, 1e-6)
    torch.testing.assert_close(h, x + r, **_tol(dtype))
    torch.testing.assert_close(y, rmsnorm_ref(x + r, w, 1e-6), **_tol(dtype))
    wide = torch.randn(rows, width + 40, device=DEVICE, dtype=dtype)  # a column slice, read
    got = rmsnorm(wide[:, :width], w, 1e-6)                           # in place (row stride)
    torch.testing.assert_close(got, rmsnorm_ref(wide[:, :width], w, 1e-6), **_tol(dtype))
    assert got.is_contiguous()


@pytest.mark.parametrize("preset, heads", [("tiny", 4), ("tiny", 20)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prologue_matches_reference(preset, heads, dtype):
    cfg = mf.MLAConfig.preset(preset)
    tokens = 9
    # Both as the model passes them: the two parts of one projection's output rows.
    qkv = torch.randn(tokens, heads * cfg.qk_head_dim + cfg.latent_dim, device=DEVICE,
                      dtype=dtype)
    q = qkv[:, : heads * cfg.qk_head_dim].unflatten(1, (heads, cfg.qk_head_dim))
    kv = qkv[:, heads * cfg.qk_head_dim :]
    w = (1 + 0.1 * torch.randn(cfg.kv_lora_rank, device=DEVICE)).to(dtype)
    pos = torch.randint(0, 5000, (tokens,), device=DEVICE, dtype=torch.int32)
    freq = yarn_inv_freq(cfg).to(DEVICE)
    q_pe, rows = mla_prologue(q[..., cfg.qk_nope_head_dim:], kv, w, pos, freq, 1.2, 1e-6)
    cos, sin = rope_cos_sin(pos, freq, 1.2)
    ref_q = apply_rope(q[..., cfg.qk_nope_head_dim:], cos, sin)
    ref_rows = torch.cat([rmsnorm_ref(kv[:, :cfg.kv_lora_rank], w, 1e-6),
                          apply_rope(kv[:, cfg.kv_lora_rank:], cos, sin)], -1)
    torch.testing.assert_close(q_pe, ref_q, **_tol(dtype))
    torch.testing.assert_close(rows, ref_rows, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens, inter", [(1, 16), (5, 1100), (3, 2048)])
def test_silu_mul_and_swiglu(dtype, tokens, inter):
    gu = torch.randn(tokens, 2 * inter, device=DEVICE, dtype=dtype) * 3
    gate, up = gu.chunk(2, dim=-1)
    torch.testing.assert_close(silu_mul(gu), torch.nn.functional.silu(gate) * up, **_tol(dtype))
    wide = torch.randn(tokens, 2 * inter + 8, device=DEVICE, dtype=dtype)[:, 8:]  # row stride
    torch.testing.assert_close(silu_mul(wide), silu_mul(wide.contiguous()), rtol=0, atol=0)
    with pytest.raises(ValueError, match="unit column stride"):
        silu_mul(gu[:, ::2])
    if dtype == torch.float32:  # the interpreter's bf16 GEMMs are not the point here
        x = torch.randn(tokens, 32, device=DEVICE)
        gate_up = torch.randn(2, inter, 32, device=DEVICE) * 32**-0.5
        down = torch.randn(32, inter, device=DEVICE) * inter**-0.5
        torch.testing.assert_close(swiglu(x, gate_up, down), swiglu_ref(x, gate_up, down),
                                   **_tol(dtype))


@pytest.mark.cuda
def test_fused_kernels_at_v2_lite_size_on_gpu():
    cfg = mf.MLAConfig.preset("v2-lite")
    x = torch.randn(4096, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = (1 + 0.1 * torch.randn(cfg.hidden_size, device="cuda")).to(torch.bfloat16)
    h, y = add_rmsnorm(x, r, w, 1e-6)
    torch.testing.assert_close(h, x + r, rtol=0, atol=0)
    torch.testing.assert_close(y, rmsnorm_ref(x + r, w, 1e-6), rtol=1e-2, atol=1e-2)
    q = torch.randn(256, 128, cfg.qk_head_dim, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(256, cfg.latent_dim, device="cuda", dtype=torch.bfloat16)
    wk = (1 + 0.1 * torch.randn(cfg.kv_lora_rank, device="cuda")).to(torch.bfloat16)
    pos = torch.randint(0, 100000, (256,), device="cuda", dtype=torch.int32)
    freq = yarn_inv_freq(cfg).cuda()
    q_pe, rows = mla_prologue(q[..., 128:], kv, wk, pos, freq, 1.0, 1e-6)
    cos, sin = rope_cos_sin(pos, freq, 1.0)
    torch.testing.assert_close(q_pe, apply_rope(q[..., 128:], cos, sin), rtol=2e-2, atol=2e-2)
    ref_rows = torch.cat([rmsnorm_ref(kv[:, :512], wk, 1e-6), apply_rope(kv[:, 512:], cos, sin)],
                         -1)
    torch.testing.assert_close(rows, ref_rows, rtol=2e-2, atol=2e-2)
    gu = torch.randn(4096, 2 * 2816, device="cuda", dtype=torch.bfloat16) * 3
    gate, up = gu.chunk(2, dim=-1)
    # The reference's rounding (silu rounded, then the product): exact but for exp's last bit.
    torch.testing.assert_close(silu_mul(gu), torch.nn.functional.silu(gate) * up,
                               rtol=8e-3, atol=1e-5)
