"""DeepSeek MoE (Dai et al. 2024; DeepSeek-V2/V3 reports): routing and the reference experts.

Routing methods, all static-shape:
- `greedy`: softmax scores, top-k.
- `group_limited_greedy` (V2): softmax scores; keep the `topk_group` groups with the highest
  single-expert score, top-k inside them.
- `noaux_tc` (V3): sigmoid scores; `score_bias` (e_score_correction_bias) is added for the
  choice of groups (ranked by the sum of their top-2) and experts only; the weights are the
  unbiased scores of the chosen experts.
Then optional normalisation (`norm_topk_prob`; HF's V2 code never normalises, and V2 checkpoints
ship it off) and `routed_scaling_factor`.

Expert parallelism: the routed experts are split evenly over the `tp` ranks of a group, rank r
holding the global experts first_expert = r * El .. (r + 1) * El - 1 (`local_experts`). Every
rank routes every token over all experts (global ids); its experts' op sums only the pairs of
its own experts (`first_expert`), and a sum over the ranks adds the rest.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.config import MLAConfig


def route(
    x: Float[Tensor, "tokens hidden"],
    router: Float[Tensor, "experts hidden"],
    score_bias: Float[Tensor, " experts"] | None,
    cfg: MLAConfig,
) -> tuple[Float[Tensor, "tokens topk"], Int[Tensor, "tokens topk"]]:
    """Top-k expert ids and their float32 weights per token. The scores are computed in
    float32, as HF does (`router` in the weights' dtype: its products with a bf16 or fp16 x
    are exact in float32)."""
    logits = x.float() @ router.float().T
    k, method = cfg.num_experts_per_tok, cfg.topk_method
    n_experts = router.shape[0]
    if method == "noaux_tc":
        scores = logits.sigmoid()
        choice = scores + score_bias.float()
        groups = choice.view(-1, cfg.n_group, n_experts // cfg.n_group)
        group_scores = groups.topk(2, dim=-1).values.sum(-1)
        choice = _mask_groups(choice, group_scores, cfg, fill=float("-inf"))
        ids = choice.topk(k, dim=-1, sorted=False).indices
        weights = scores.gather(1, ids)
    else:
        scores = logits.softmax(dim=-1)
        if method == "group_limited_greedy":
            groups = scores.view(-1, cfg.n_group, n_experts // cfg.n_group)
            scores = _mask_groups(scores, groups.amax(-1), cfg, fill=0.0)
        weights, ids = scores.topk(k, dim=-1, sorted=False)
    if cfg.norm_topk_prob and (method == "noaux_tc" or cfg.model_type == "deepseek_v3"):
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * cfg.routed_scaling_factor, ids


def _mask_groups(
    scores: Float[Tensor, "tokens experts"],
    group_scores: Float[Tensor, "tokens groups"],
    cfg: MLAConfig,
    fill: float,
) -> Float[Tensor, "tokens experts"]:
    keep = group_scores.topk(cfg.topk_group, dim=-1, sorted=False).indices
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
    tokens, groups = group_scores.shape
    mask = mask[:, :, None].expand(tokens, groups, scores.shape[1] // groups)
    return scores.masked_fill(~mask.reshape(scores.shape), fill)


def local_experts(n_experts: int, tp: int, rank: int) -> tuple[int, int]:
    """(first_expert, El): rank `rank` of `tp` holds the global experts first_expert ..
    first_expert + El - 1, El = n_experts / tp."""
    if tp < 1 or not 0 <= rank < tp:
        raise ValueError(f"rank {rank} of a group of {tp}: expected 0 <= rank < tp")
    if n_experts % tp:
        raise ValueError(f"{n_experts} routed experts do not split evenly over {tp} ranks")
    return rank * (n_experts // tp), n_experts // tp


def check_local_experts(gate_up: Tensor, down: Tensor, first_expert: int | None) -> None:
    """A ValueError unless `gate_up` and `down` hold the same experts, and `first_expert`
    (None: every expert) is a rank's first of an even split: a multiple of their count, >= 0."""
    n = gate_up.shape[0]
    if down.shape[0] != n:
        raise ValueError(f"gate_up holds {n} experts and down {down.shape[0]}")
    if first_expert is not None and (first_expert < 0 or first_expert % n):
        raise ValueError(f"first_expert {first_expert} is not the first of {n} local experts "
                         f"(an even split starts rank r at r * {n})")


def experts_reference(
    x: Float[Tensor, "tokens hidden"],
    weights: Float[Tensor, "tokens topk"],
    ids: Int[Tensor, "tokens topk"],
    gate_up: Float[Tensor, "experts 2 moe_inter hidden"],
    down: Float[Tensor, "experts hidden moe_inter"],
    first_expert: int | None = None,
) -> Float[Tensor, "tokens hidden"]:
    """Every expert over every token, masked by the routing: exact, static, and slow.
    `first_expert`: the experts are the global ones first_expert.. (`ids` are global; the
    pairs of other experts add nothing)."""
    check_local_experts(gate_up, down, first_expert)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(gate_up.shape[0]):
        w = (weights * (ids == e + (first_expert or 0))).sum(-1, keepdim=True)
        gate, up = (x @ gate_up[e].flatten(0, 1).T).chunk(2, dim=-1)
        out += w * ((F.silu(gate) * up) @ down[e].T).float()
    return out.to(x.dtype)
