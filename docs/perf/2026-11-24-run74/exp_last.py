"""The MoE pair sum as the down kernel's tail (`MoEConfig.last_sum`, the direct rows of 1-4
tokens) against the table's sum launch, in one process, alternating rounds (2026-11-24,
fifteenth session). 2026-11-24-run57/exp_inline.py's parts, with two more variants: `ls` (the
direct rows with last_sum, the down kernel's dependants launched at once) and `ls0` (the same,
launched at its end: `fused_moe.LAST_SUM_TRIGGER` off); `tab` is the table.

    PYTHONPATH=. python3 exp_last.py layer|step [--batch 1 2 4] [--rounds 6]
        --variants tab ls ls0
"""

import sys
from dataclasses import replace

from mla_func.kernels import fused_moe
from mla_func.kernels.moe_config import pick_config

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/2026-11-24-run57")
import exp_inline  # noqa: E402

_CONFIG_OF, _APPLY = exp_inline.config_of, exp_inline.apply


def config_of(variant: str, tokens: int):
    if variant in ("ls", "ls0"):
        cfg = pick_config(tokens)
        return replace(cfg, last_sum=cfg.direct)
    return _CONFIG_OF(variant, tokens)


def apply(variant: str | None) -> None:
    fused_moe.LAST_SUM_TRIGGER = variant != "ls0"
    _APPLY(variant)


exp_inline.config_of, exp_inline.apply = config_of, apply

if __name__ == "__main__":
    exp_inline.main()
