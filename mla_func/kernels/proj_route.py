"""A few decode rows' output projection, residual add, FFN RMSNorm and MoE routing, with no
launch level of its own for the norm.

`proj_add_norm_route(o, w, h, weight, eps, router, score_bias, *settings)` returns
(h + o w^T, x = rmsnorm(h + o w^T) * weight, routing weights, expert ids): `proj_norm`'s
results, then `router`'s for x (HF DeepseekV2's o_proj, residual add,
post_attention_layernorm and MoE gate).

Why an op of its own: at one to four rows `proj_norm`'s kernel spends a dependent level on the
norm (its last program normalises the rows whole, and the router waits for that). Here the
projection's programs store h + o w^T only, each its own columns, and `router_rows`'
programs, which read whole rows anyway, normalise h themselves (`norm.rms_scaled`, the same
arithmetic), route and store x, each program a share of its columns. Taking that level out
of the V2-Lite step (numbers wrong, an upper bound) saved 47-50 us a step at one row on an
H100 (docs/perf/2026-11-24-h100-run90). Elsewhere (more rows, wider rows, the split router)
the op is `proj_add_rmsnorm`, then `moe_route`.

x is written by the router's launch: a launch after it must not read x before waiting for the
router's end -- the experts' folded shared tiles, which otherwise start early under PDL, wait
(`moe.experts_add_norm`'s `x_late`).
"""

from typing import Optional

import torch
from torch import Tensor

from mla_func.kernels import proj_norm, router, router_rows


def fits(o: Tensor, w: Tensor, h: Tensor, router_w: Tensor) -> bool:
    """Whether the op runs the two launches without the norm's level for these shapes."""
    return (proj_norm.fits(o, w, h) and router.few_rows(o.shape[0], router_w.shape[0])
            and router_rows.fits_norm(h.shape[1]))


# typing.Optional: the schema inference of older torch looks the annotation up in a table.
@torch.library.custom_op("mla_func::proj_add_norm_route", mutates_args=())
def proj_add_norm_route(
    o: Tensor, w: Tensor, h: Tensor, weight: Tensor, eps: float, router_w: Tensor,
    score_bias: Optional[Tensor], top_k: int, n_group: int, topk_group: int,  # noqa: UP045
    method: str, normalize: bool, scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(h + o w^T, its RMSNorm * weight, routing weights fp32, expert ids int64)."""
    if not fits(o, w, h, router_w):
        h_out, x = proj_norm.proj_add_rmsnorm(o, w, h, weight, eps)
        weights, ids = router.moe_route(x, router_w, score_bias, top_k, n_group, topk_group,
                                        method, normalize, scale)
        return h_out, x, weights, ids
    h_out = proj_norm.project_add(o, w, h)
    x = torch.empty(h.shape, dtype=torch.promote_types(h.dtype, weight.dtype), device=h.device)
    weights, ids = router.launch(h_out, router_w, score_bias, top_k, n_group, topk_group,
                                 method, normalize, scale, norm=(weight, eps, x))
    return h_out, x, weights, ids


@proj_add_norm_route.register_fake
def _(o, w, h, weight, eps, router_w, score_bias, top_k, n_group, topk_group, method,
      normalize, scale):
    shape = (h.shape[0], top_k)
    return (torch.empty_like(h),
            torch.empty(h.shape, dtype=torch.promote_types(h.dtype, weight.dtype),
                        device=h.device),
            torch.empty(shape, dtype=torch.float32, device=h.device),
            torch.empty(shape, dtype=torch.int64, device=h.device))
