"""Progress reporting for long generation runs.

A token counter shown with tqdm when it is installed (as vLLM's `LLM.generate(use_tqdm=True)`
does), else as one rewritten stderr line; by default it appears only once a run has lasted
`AUTO_PROGRESS_DELAY_S`, so tests and short runs print nothing. This module owns `Progress`;
`mla_func.engine` drives it from `Engine.run`.
"""

import sys
import time

AUTO_PROGRESS_DELAY_S = 2.0  # progress=None shows a bar only for runs longer than this


class Progress:
    """tqdm when installed, else one stderr line; enabled=None shows it only after
    AUTO_PROGRESS_DELAY_S seconds, so short runs print nothing."""

    def __init__(self, total: int, enabled: bool | None, desc: str = "generate") -> None:
        self.on, self.delay = enabled is not False, 0.0 if enabled else AUTO_PROGRESS_DELAY_S
        self.n, self.start, self.last, self.bar = 0, time.perf_counter(), 0.0, None
        self.desc = desc
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        if self.on and tqdm is not None:
            self.bar = tqdm(total=total, unit="tok", desc=desc, delay=self.delay)

    def update(self, n: int, total: int) -> None:
        """Count `n` more tokens out of a `total` that may shrink (a request ending at eos)."""
        self.n += n
        if not self.on:
            return
        if self.bar is not None:
            self.bar.total = total
            self.bar.update(n)
            return
        now = time.perf_counter() - self.start
        if now >= self.delay and (not self.last or now - self.last >= 0.5):
            self.last = now
            print(f"\r{self.desc}: {self.n}/{total} tokens, {self.n / max(now, 1e-9):.1f} tok/s",
                  end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Close the bar, or end the stderr line if one was printed."""
        if self.bar is not None:
            self.bar.close()
        elif self.last:  # end the \r line
            print(file=sys.stderr)
