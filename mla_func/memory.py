"""How much memory new tensors on a device may take, asked before a large allocation.

`init_state` (the cache) and the scripts that build weights (`scripts/generate.py`) ask this
before they allocate, so that a request larger than the device refuses at once with both sizes
named, instead of ending in the allocator's raw error or, on the host, in minutes of swapping
and the OOM killer. One answer for both: the CUDA driver's free memory, or on the host
`MemAvailable` (/proc/meminfo; the free pages where that file is absent).
"""

import os

import torch


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


__all__ = ["available_bytes", "human"]
