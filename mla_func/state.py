"""KVState: the paged latent cache, passed into and returned from the step function.

The cache stores only [c_kv, k_pe] per token per layer (DeepSeek-V2, arXiv:2405.04434, 2.1.3:
576 values in V2/V3), in pages of `page_size` tokens. Page 0 is reserved as a scratch page that
no sequence owns: rows added to pad a batch to a fixed size point their page tables at it, so
they never read or write a live page. The host-side `PageAllocator` hands out the other pages.

`forward` consumes the state (like JAX buffer donation; `mla_func.donation`): the cache is
written in place so that its address stays fixed from step to step, and the returned state is a
new handle of the same buffers. The state passed is spent: passing it again raises
`ConsumedError` (a host-side flag, no device work).

With `kv_dtype="fp8"` the cache holds FlashMLA's FP8 rows instead (`mla_func.cache_fp8`: 656
bytes a token a layer at V2/V3's sizes, uint8 `[layers, pages, page_size, cache_row]`), the
same pages and slots; `KVState.kv_dtype` says which.

A state also owns its kernels' runtime (`kernels.launch.runtime.Runtime`): the arrival
counters (`counters`, a tensor the counting ops receive and declare mutated, zero between
launches), the decode workspace and the side streams. Two states never share them, so two
engines in one process never do.
"""

import math
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.cache_fp8 import Fp8Cache, check_kv_dtype, fp8_layout, is_fp8
from mla_func.config import MLAConfig
from mla_func.dtypes import resolve_dtype
from mla_func.kernels.launch.runtime import Runtime
from mla_func.memory import available_bytes, human
from mla_func.validation import positive_int

# Float rows of `latent` values, or FP8 rows of `cache_row` bytes (`cache_fp8`).
LatentCache = Float[Tensor, "layers pages page_size latent"] | Fp8Cache
SCRATCH_PAGE = 0


class CacheFullError(ValueError):
    """The cache has no free page left for a request."""


class PageAllocator:
    """Host-side free list of cache pages; page 0 (scratch) is never handed out."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 2:
            raise ValueError(f"need at least 2 pages (one is scratch), got {num_pages}")
        self.num_pages, self.page_size = num_pages, page_size
        self._free: list[int] = list(range(num_pages - 1, SCRATCH_PAGE, -1))
        self.pages: dict[int, list[int]] = {}

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one sequence could ever hold (every page but scratch)."""
        return (self.num_pages - 1) * self.page_size

    def pages_needed(self, seq_id: int, total_tokens: int) -> int:
        have = len(self.pages.get(seq_id, ()))
        return max(0, -(-total_tokens // self.page_size) - have)

    def reserve(self, seq_id: int, total_tokens: int) -> list[int]:
        """Grow `seq_id` to hold `total_tokens`; all or nothing (CacheFullError)."""
        need = self.pages_needed(seq_id, total_tokens)
        if need > len(self._free):
            raise CacheFullError(
                f"sequence {seq_id} needs {need} more page(s) for {total_tokens} tokens, "
                f"{len(self._free)} free")
        owned = self.pages.setdefault(seq_id, [])
        for _ in range(need):
            owned.append(self._free.pop())
        return owned

    def release(self, seq_id: int) -> None:
        self._free.extend(reversed(self.pages.pop(seq_id, [])))


@dataclass(frozen=True)
class KVState:
    """The cache must be one dense [layers, pages, page_size, latent] tensor of floats, or of
    FP8 rows ([..., cache_row] bytes, `cache_fp8`; `kv_dtype` says which): the kernels
    address a page by its index times a page's size, and the allocator's geometry must be
    the cache's. A state built otherwise is refused here (ValueError), not read wrongly."""

    cache: LatentCache
    allocator: PageAllocator = field(compare=False)
    # The runtime's arrival counters (made with the runtime when not given).
    counters: Int[Tensor, " counters"] | None = field(default=None, compare=False)
    runtime: Runtime | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        c, alloc = self.cache, self.allocator
        if c.dim() != 4:
            raise ValueError(f"KVState.cache must be [layers, pages, page_size, latent]; got "
                             f"shape {tuple(c.shape)}")
        if not (c.is_floating_point() or is_fp8(c)):
            raise ValueError(f"KVState.cache must hold floats or FP8 rows (uint8); got {c.dtype}")
        if not c.is_contiguous():
            raise ValueError(f"KVState.cache must be contiguous (the kernels index pages by "
                             f"offset); got strides {c.stride()} for shape {tuple(c.shape)}")
        if (alloc.num_pages, alloc.page_size) != (c.shape[1], c.shape[2]):
            raise ValueError(f"the allocator's {alloc.num_pages} pages of {alloc.page_size} "
                             f"tokens do not match the cache's {c.shape[1]} of {c.shape[2]}")
        runtime = self.runtime
        if runtime is None:
            runtime = Runtime(c.device)
            object.__setattr__(self, "runtime", runtime)
        if self.counters is None:
            object.__setattr__(self, "counters", runtime.counters)
        elif self.counters is not runtime.counters:
            raise ValueError("KVState.counters must be its runtime's counters")
        runtime.own(c)

    @property
    def page_size(self) -> int:
        return self.cache.shape[2]

    @property
    def num_pages(self) -> int:
        return self.cache.shape[1]

    @property
    def kv_dtype(self) -> str:
        """"fp8" (`cache_fp8`'s rows) or the float cache's dtype name ("bfloat16")."""
        return "fp8" if is_fp8(self.cache) else str(self.cache.dtype).removeprefix("torch.")

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's row in one layer (656 for V2/V3's FP8 rows, 1,152 in bf16)."""
        return self.cache.shape[3] * self.cache.element_size()


def init_state(
    cfg: MLAConfig,
    num_pages: int,
    page_size: int = 16,
    device: "str | torch.device" = "cpu",
    dtype: "torch.dtype | str" = torch.float32,
    kv_dtype: str = "auto",
) -> KVState:
    """An empty cache of `num_pages` pages (page 0 is scratch); `dtype` a torch.dtype or its
    name (`dtypes.DTYPES`). `kv_dtype` "fp8": FP8 rows (`cache_fp8`) instead of `dtype`
    floats; "auto": `dtype`."""
    dtype = resolve_dtype(dtype, "the cache's dtype")
    positive_int("num_pages", num_pages, 2)  # page 0 is the scratch page
    positive_int("page_size", page_size)
    row = cfg.latent_dim
    if check_kv_dtype(kv_dtype) == "fp8":
        row, dtype = fp8_layout(cfg.kv_lora_rank, cfg.qk_rope_head_dim).row_bytes, torch.uint8
    shape = (cfg.num_hidden_layers, num_pages, page_size, row)
    _check_fits(math.prod(shape) * dtype.itemsize, torch.device(device), shape, dtype)
    cache = torch.zeros(shape, device=device, dtype=dtype)
    return KVState(cache=cache, allocator=PageAllocator(num_pages, page_size))


def _check_fits(nbytes: int, device: torch.device, shape: tuple[int, ...],
                dtype: torch.dtype) -> None:
    """A ValueError naming the sizes when the cache cannot fit, instead of the allocator's
    raw error (or, on the host, the machine swapping)."""
    room = available_bytes(device)
    if room is not None and nbytes > room:
        unit, kind = ("bytes", "fp8 rows") if dtype == torch.uint8 else ("values", dtype)
        raise ValueError(
            f"a cache of {shape[1]} pages x {shape[2]} tokens x {shape[3]} {unit} x {shape[0]} "
            f"layers in {kind} needs {human(nbytes)} but {device} has {human(room)} "
            "available: lower num_pages")
