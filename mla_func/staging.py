"""Pinned host staging for the inputs the host builds every step (`HostStaging`).

A host-to-device copy runs asynchronously only from pinned memory, and pinning a fresh buffer
every step (`Tensor.pin_memory()`) costs host time that varies by machine, up to milliseconds
a step (docs/DECISIONS.md, `staging.HostStaging`). `HostStaging` takes that cost out of the
step: it keeps a ring of pinned buffers, allocated on first use and only grown:
each copy goes through the next slot, and a slot is rewritten only once the copy that last read
it has run (an event recorded behind that copy), so no copy in flight sees its source change.
With one step in flight and two copies a step, that event has long fired when its slot comes
round again, so the wait costs nothing.
"""

import torch
from torch import Tensor

# Smallest slot: a 128-sequence decode batch of a 4k-token cache needs ~12 KB.
_MIN_BYTES = 16384


class HostStaging:
    """A ring of `slots` pinned byte buffers feeding copies to one CUDA device."""

    def __init__(self, device: "str | torch.device", slots: int = 4) -> None:
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"HostStaging feeds a CUDA device, not {self.device}")
        if slots < 2:
            raise ValueError(f"HostStaging needs at least 2 slots, got {slots}")
        self._buffers: list[Tensor | None] = [None] * slots
        self._events: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0

    def to_device(self, src: Tensor) -> Tensor:
        """A copy of the CPU tensor `src` on the device, queued on the current stream."""
        if src.device.type != "cpu":
            raise ValueError(f"HostStaging copies CPU tensors, got one on {src.device}")
        raw = src.contiguous().view(-1).view(torch.uint8)
        n = raw.numel()
        slot = self._next
        self._next = (slot + 1) % len(self._buffers)
        event = self._events[slot]
        if event is not None:
            event.synchronize()  # the copy that last read this slot has run
        buf = self._buffers[slot]
        if buf is None or buf.numel() < n:
            size = max(_MIN_BYTES, 1 << (n - 1).bit_length())
            buf = self._buffers[slot] = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        buf[:n].copy_(raw)
        out = torch.empty(n, dtype=torch.uint8, device=self.device)
        out.copy_(buf[:n], non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._events[slot] = event
        return out.view(src.dtype).view(src.shape)
