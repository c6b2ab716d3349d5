"""The projection + residual add + norm + MoE routing op (mla_func/kernels/proj_route.py)
against `proj_add_rmsnorm` then `moe_route` (and the torch reference): fresh random inputs,
new buffers NaN-poisoned (`nan_empty`), so that a column of x no router program stores shows.

CPU: the Triton interpreter at small sizes, float32 (as test_router.py); V2-Lite sizes in
bf16 under `pytest -m cuda`.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined (CPU only)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from linear_helpers import DEV, projection_inputs  # noqa: E402
from test_router import _assert_same_routing, _assert_same_routing_up_to_ties, _cfg  # noqa: E402

from mla_func.config import MLAConfig  # noqa: E402
from mla_func.kernels import proj_route, router  # noqa: E402
from mla_func.kernels.proj_norm import proj_add_rmsnorm  # noqa: E402
from mla_func.kernels.router import settings  # noqa: E402
from mla_func.ops.moe import route  # noqa: E402
from mla_func.ops.norm import rmsnorm  # noqa: E402


def _inputs(cfg, rows, n_in, hidden, dtype, seed):
    o, w, h, weight = projection_inputs(rows, n_in, hidden, dtype, seed, residual=True)
    g = torch.Generator().manual_seed(seed + 1)
    r = (torch.randn(cfg.n_routed_experts, hidden, generator=g) * hidden**-0.5).to(DEV)
    bias = (0.1 * torch.randn(cfg.n_routed_experts, generator=g)).to(DEV)
    return o, w, h, weight, r, bias if cfg.topk_method == "noaux_tc" else None


def _op(o, w, h, weight, r, bias, cfg):
    return torch.ops.mla_func.proj_add_norm_route(o, w, h, weight, 1e-6, r, bias,
                                                 *settings(cfg))


@pytest.mark.parametrize("rows", [1, 2, 4, 5])
@pytest.mark.parametrize("method, experts, n_group, topk_group, k", [
    ("greedy", 64, 1, 1, 6), ("noaux_tc", 8, 4, 2, 2), ("group_limited_greedy", 48, 4, 2, 4),
])
def test_matches_projection_then_router(rows, method, experts, n_group, topk_group, k,
                                        nan_empty):
    cfg = _cfg(method, experts, k, n_group, topk_group, norm=True, scale=2.5)
    o, w, h, weight, r, bias = _inputs(cfg, rows, 48, 40, torch.float32, seed=rows)
    assert proj_route.fits(o, w, h, r) == (rows <= 4)  # 5 rows: the two ops
    h_new, x, weights, ids = _op(o, w, h, weight, r, bias, cfg)
    want_h, want_x = proj_add_rmsnorm(o, w, h, weight, 1e-6)
    torch.testing.assert_close(h_new, want_h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x, want_x, rtol=1e-5, atol=1e-5)
    _assert_same_routing((weights, ids), router.moe_route(want_x, r, bias, *settings(cfg)))
    ref_h = h + o @ w.T
    torch.testing.assert_close(x, rmsnorm(ref_h, weight, 1e-6), rtol=1e-4, atol=1e-4)
    _assert_same_routing((weights, ids), route(x, r, bias, cfg))


def test_routes_the_split_way_without_the_few_row_router(monkeypatch, nan_empty):
    monkeypatch.setattr(router, "FEW_ROWS", False)
    cfg = _cfg("greedy", 64, 6)
    o, w, h, weight, r, bias = _inputs(cfg, 2, 48, 40, torch.float32, seed=3)
    assert not proj_route.fits(o, w, h, r)
    h_new, x, weights, ids = _op(o, w, h, weight, r, bias, cfg)
    torch.testing.assert_close(x, rmsnorm(h + o @ w.T, weight, 1e-6), rtol=1e-4, atol=1e-4)
    _assert_same_routing((weights, ids), route(x, r, bias, cfg))


def test_router_refuses_to_normalise_many_rows():
    cfg = _cfg("greedy", 8, 2)
    x = torch.randn(router.router_rows.MAX_ROWS + 1, 32, device=DEV)
    r = torch.randn(8, 32, device=DEV)
    with pytest.raises(ValueError, match="normalises its input at 1 to"):
        router.launch(x, r, None, *settings(cfg), norm=(x[0], 1e-6, x))


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_v2_lite_size_on_gpu(rows):
    cfg = MLAConfig.preset("v2-lite")
    o, w, h, weight, r, bias = _inputs(cfg, rows, 2048, 2048, torch.bfloat16, seed=rows)
    r = r.float()
    assert proj_route.fits(o, w, h, r)
    h_new, x, weights, ids = _op(o, w, h, weight, r, bias, cfg)
    want_h, want_x = proj_add_rmsnorm(o, w, h, weight, 1e-6)
    assert torch.equal(h_new, want_h)
    # The norm's sum of squares in another order than proj_norm's last program: x may differ
    # from its x by a rounding step in a few elements.
    torch.testing.assert_close(x.float(), want_x.float(), rtol=1e-2, atol=1e-2)
    _assert_same_routing_up_to_ties((weights, ids), route(x, r, bias, cfg), (x, r, bias, cfg))
