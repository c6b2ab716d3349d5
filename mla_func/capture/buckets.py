"""Stage 4, buckets: a pure function from a dynamic dim's range and a policy to the sizes that
get a captured graph, and the padding waste those sizes imply.

The default policy (`bounded`) takes 1, 2, 4, 8, 16, 24, 32 and then `1 / max_waste` evenly
spaced sizes per octave (36, 40, ..., 64, 72, ..., 128, 144, ...): a batch of n > 32 is padded
by less than 12.5%, sizes above 8 are multiples of 4 (of 8 from 64 on), and the graph count grows
with log(max) (39 sizes up to 512, 71 up to 8192). The `vllm`, `sglang` and `nano` policies
reproduce those projects' lists for comparison (graphs/README.md has the table).
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BucketPolicy:
    name: str = "bounded"
    max_waste: float = 0.125  # padding bound above `dense_to`
    dense_to: int = 32  # below: 1, 2, 4, 8, 16, then steps of 8


def _bounded(max_size: int, p: BucketPolicy) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8, 16) if s < p.dense_to]
    sizes += list(range(24, p.dense_to + 1, 8)) if p.dense_to >= 24 else []
    sizes.append(p.dense_to)
    lo = p.dense_to
    while lo < max_size:
        # Sizes `step` apart pad n > lo by less than step / lo <= max_waste; 2 * lo closes the
        # octave even where step does not divide lo.
        step = max(1, int(lo * p.max_waste))
        sizes += [*range(lo + step, 2 * lo, step), 2 * lo]
        lo *= 2
    return sizes


def _vllm(max_size: int) -> list[int]:
    return [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))


def _sglang(max_size: int) -> list[int]:
    return (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
            + list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
            + list(range(4608, max(max_size, 4608) + 1, 512)))


def _nano(max_size: int) -> list[int]:
    return [1, 2, 4, 8] + list(range(16, max_size + 1, 16))


NAMED = {"vllm": _vllm, "sglang": _sglang, "nano": _nano}


def bucket_sizes(max_size: int, policy: "BucketPolicy | str | None" = None) -> tuple[int, ...]:
    """Sorted sizes, all <= max_size, the last == max_size (so every n <= max fits)."""
    if max_size < 1:
        raise ValueError(f"max_size must be >= 1, got {max_size}")
    if isinstance(policy, str) and policy in NAMED:
        raw = NAMED[policy](max_size)
    else:
        if isinstance(policy, str) and policy != "bounded":
            raise ValueError(f"unknown bucket policy {policy!r}; known: "
                             f"{['bounded', *sorted(NAMED)]} or a BucketPolicy")
        if policy is None or isinstance(policy, str):
            policy = BucketPolicy()
        if not 0 < policy.max_waste <= 1:
            raise ValueError(f"max_waste must be in (0, 1]; got {policy.max_waste}")
        raw = _bounded(max_size, policy)
    sizes = sorted({s for s in raw if 1 <= s < max_size} | {max_size})
    return tuple(sizes)


def pad_to(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest bucket >= n, or None when n is above the largest (run eagerly)."""
    lo, hi = 0, len(sizes)
    while lo < hi:
        mid = (lo + hi) // 2
        if sizes[mid] < n:
            lo = mid + 1
        else:
            hi = mid
    return sizes[lo] if lo < len(sizes) else None


def padding_waste(sizes: Sequence[int], above: int = 0) -> float:
    """max over n in (above, max] of (pad(n) - n) / n: the worst padded fraction."""
    worst, prev = 0.0, 0
    for s in sizes:
        n = max(prev + 1, above + 1)  # the worst n padded to s is the smallest one
        if n <= s:
            worst = max(worst, (s - n) / n)
        prev = s
    return worst


def summary(sizes: Sequence[int]) -> dict:
    return {
        "sizes": list(sizes),
        "graphs": len(sizes),
        "max_padding_waste": round(padding_waste(sizes), 4),
        "max_padding_waste_above_32": round(padding_waste(sizes, above=32), 4),
    }
