"""How much memory new tensors on a device may take, asked before a large allocation.

`init_state` (the cache) and the scripts that build weights (`scripts/generate.py`) ask this
before they allocate, so that a request larger than the device refuses at once with both sizes
named, instead of ending in the allocator's raw error or, on the host, in minutes of swapping
and the OOM killer. One answer for both: the CUDA driver's free memory, or on the host
`MemAvailable` (/proc/meminfo; the free pages where that file is absent).

And how many cache pages, and so how many sequences, a budget holds: a token takes
`cache_row_bytes` in each layer (1,152 bytes in bf16 at V2/V3's sizes, 656 as FP8 rows:
`cache_fp8`), so the FP8 cache holds 1152 / 656 = 1.76x the sequences.
"""

import os

import torch

from mla_func.cache_fp8 import check_kv_dtype, fp8_layout
from mla_func.config import MLAConfig


def available_bytes(device: torch.device | str) -> int | None:
    """Bytes new tensors on `device` may take now; None where that is unknown (meta, other
    device types, a host that reports neither figure)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.mem_get_info(dev)[0]
    if dev.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # names this platform does not define
        return None


def human(n: int) -> str:
    """n bytes in the largest binary unit that keeps the number at least 1, two decimals
    (`1.50 GiB`), so that a request just past the room does not read as equal to it."""
    if n < 1024:
        return f"{n} B"
    x = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        x /= 1024
        if x < 1024 or unit == "TiB":
            break
    return f"{x:.2f} {unit}"


def cache_row_bytes(cfg: MLAConfig, kv_dtype: str = "auto",
                    dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes one token takes in one layer of the latent cache: `latent` values in `dtype`
    ("auto"), or the FP8 row (`kv_dtype="fp8"`)."""
    if check_kv_dtype(kv_dtype) == "fp8":
        return fp8_layout(cfg.kv_lora_rank, cfg.qk_rope_head_dim).row_bytes
    return cfg.latent_dim * dtype.itemsize


def cache_pages(cfg: MLAConfig, budget: int, page_size: int, kv_dtype: str = "auto",
                dtype: torch.dtype = torch.bfloat16) -> int:
    """Pages of `page_size` tokens (every layer's; the scratch page among them) that `budget`
    bytes hold: `init_state`'s `num_pages` for that budget."""
    return budget // (page_size * cfg.num_hidden_layers * cache_row_bytes(cfg, kv_dtype, dtype))


def cache_sequences(cfg: MLAConfig, budget: int, seq_len: int, page_size: int,
                    kv_dtype: str = "auto", dtype: torch.dtype = torch.bfloat16) -> int:
    """Sequences of `seq_len` tokens that a cache of `budget` bytes holds at once (each in
    whole pages; page 0 is scratch)."""
    pages = cache_pages(cfg, budget, page_size, kv_dtype, dtype)
    return max(0, pages - 1) // -(-seq_len // page_size)


__all__ = ["available_bytes", "cache_pages", "cache_row_bytes", "cache_sequences", "human"]
