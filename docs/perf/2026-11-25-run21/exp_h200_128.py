"""Run 22's best H200 sweep config at 128 tokens, in the V2-Lite whole step at B=128 (run 23):
`exp_tiles.py` (2026-11-24-run148) with one more variant, gate_up (64, 64, 4, 4) and down
(128, 64, 4, 4) on the tree's 128-token row (block_m 32, PDL, inline_align).

    PYTHONPATH=. python3 docs/perf/2026-11-25-run21/exp_h200_128.py --batch 128 --ctx 512 \
        --only tree sw128
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-11-24-run148"))
import exp_tiles  # noqa: E402

exp_tiles.VARIANTS["sw128"] = ((64, 64, 4, 4), (128, 64, 4, 4))

if __name__ == "__main__":
    exp_tiles.main()
