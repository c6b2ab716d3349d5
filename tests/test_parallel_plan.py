"""The plan on several GPUs, on the CPU: which form each sum over ranks takes (pushed
one-shot or NCCL, and the sub-layer end in one launch), and V3 planned over 8 ranks."""

import mla_func as mf


def test_plan_picks_each_sums_form():
    """The plan's forms of a sum over ranks: the pushed one-shot launch up to
    ONE_SHOT_MAX_BYTES on CUDA, and no more than ONE_SHOT_MAX_SENT sent by each rank (8 ranks
    send their rows 7 times), NCCL past it (and gloo's on the CPU); the sum, add and norm as
    one launch at every one-shot size (docs/DECISIONS.md)."""
    from mla_func.kernels.plan import (
        ONE_SHOT_MAX_BYTES,
        ONE_SHOT_MAX_SENT,
        all_reduce_form,
        one_shot_max_bytes,
        reduce_norm_fused,
    )

    assert one_shot_max_bytes(2) == one_shot_max_bytes(4) == ONE_SHOT_MAX_BYTES
    assert all_reduce_form(ONE_SHOT_MAX_BYTES, True, True, 2) == "one_shot"
    assert all_reduce_form(ONE_SHOT_MAX_BYTES + 2, True, True, 2) == "nccl"
    assert all_reduce_form(2, False, True, 2) == all_reduce_form(2, True, False, 2) == "nccl"
    eight = one_shot_max_bytes(8)
    assert eight % 16 == 0 and eight * 7 <= ONE_SHOT_MAX_SENT < (eight + 16) * 7
    assert all_reduce_form(eight, True, True, 8) == "one_shot"
    assert all_reduce_form(eight + 2, True, True, 8) == "nccl"

    def fused(rows, width, ranks=2, **opts):
        flags = {"cuda": True, "fused": True, "reduce_norm": True, "one_shot": True, **opts}
        return reduce_norm_fused(rows, width, 2, **flags, ranks=ranks)

    assert all(fused(rows, 2048) for rows in (1, 8, 31, 128, 448)) and not fused(449, 2048)
    assert fused(1, 7168) and fused(128, 7168) and not fused(129, 7168)  # the one-shot size
    assert fused(128, 7168, ranks=4) and fused(54, 7168, ranks=8)
    assert not fused(55, 7168, ranks=8)  # 7 x 55 rows of 7168 sent: past ONE_SHOT_MAX_SENT
    for off in ("cuda", "fused", "reduce_norm", "one_shot"):
        assert not fused(1, 2048, **{off: False}), off


def test_v3_plans_over_eight_ranks():
    """Issue 50's shape, planned on the CPU: V3 over 8 GPUs (16 heads and 32 experts a rank),
    block-FP8 weights and the FP8 cache, decode at 1-128 sequences on an sm90 GPU."""
    from mla_func.dims import static_sizes
    from mla_func.kernels.plan import DeviceSpec, default_options, plan_step

    cfg = mf.MLAConfig.preset("v3")
    sizes = static_sizes(cfg, 8)
    assert (sizes["heads"], sizes["local_experts"], sizes["experts"]) == (16, 32, 256)
    h200 = DeviceSpec("cuda", 132, (9, 0))
    for b in (1, 32, 128):
        plan = plan_step(cfg, h200, b, b, options=default_options("cuda", "triton"),
                         max_pages=64, page_size=64, ranks=8, weights="fp8", kv_dtype="fp8")
        assert (plan.projections, plan.experts_precision, plan.cache) == ("fp8", "fp8", "fp8")
        # 7168-wide rows: each sub-layer's sum, add and norm in one launch up to 54 rows
        # (8 ranks send theirs 7 times: `one_shot_max_bytes`), NCCL's sum at 128
        assert (plan.all_reduce, plan.reduce_norm) == (
            ("one_shot", True) if b <= 54 else ("nccl", False)), b
        assert plan.decode is not None and plan.decode.fp8 and not plan.decode.ws, b
        # 16 heads a rank: decode_fp8.py's kernel, float16 products from 32 sequences
        assert plan.decode.group_scores and plan.decode.f16 == (b >= 32), b
