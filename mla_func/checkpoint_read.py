"""Reading HF safetensors checkpoints one tensor, or one slice of one, at a time.

`Reader` opens every shard (`weight_files`: the index's files, or every *.safetensors),
records each key's shape and stored dtype, and reads a key's rows x cols only: dequantised to
a float dtype (`get`), or for block-FP8 params as stored, with its block scales expanded
(`pair`, for `checkpoint_fp8`). Block-FP8 matrices carry `<key>_scale_inv`, one float32 scale
per block of `quantization_config.weight_block_size` (DeepSeek-V3's release format).
"""

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from mla_func.checkpoint_fp8 import Pair
from mla_func.checkpoint_write import INDEX_FILE, CheckpointError
from mla_func.fp8 import expand_scales, quantize_matrix

SCALE_SUFFIX = "_scale_inv"  # block-FP8: `<name>.weight_scale_inv` next to `<name>.weight`


def weight_files(directory: Path) -> list[Path]:
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index} is not a safetensors index ({e!r})") from e
        absent = [n for n in names if not (directory / n).is_file()]
        if absent:
            raise CheckpointError(f"{index} names shard(s) that do not exist: {absent}")
        return [directory / n for n in names]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors weights in {directory}")
    return files


def fp8_block(raw: dict[str, Any]) -> tuple[int, int]:
    block = (raw.get("quantization_config") or {}).get("weight_block_size") or (128, 128)
    return int(block[0]), int(block[1])


class Reader:
    """Open shards, key -> (handle, shape); reads and converts one tensor at a time."""

    def __init__(self, files: list[Path], stack: ExitStack, block: tuple[int, int]) -> None:
        self.where: dict[str, Any] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}  # safetensors names: "BF16", "F8_E4M3", ...
        self.fp8: set[str] = set()
        self.block = block
        self.rope_perm: Tensor | None = None  # set for rope_interleave=False checkpoints
        duplicated = []
        for path in files:
            try:
                handle = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            except SafetensorError as e:  # truncated or not safetensors: a format error only
                raise CheckpointError(f"{path} is not a readable safetensors file: {e}") from e
            for key in handle.keys():
                if key in self.where:
                    duplicated.append(key)
                self.where[key] = handle
                info = handle.get_slice(key)
                self.shapes[key], self.dtypes[key] = tuple(info.get_shape()), info.get_dtype()
        if duplicated:
            raise CheckpointError(f"keys stored in more than one shard: {sorted(duplicated)}")

    def get(self, key: str, device: torch.device, dtype: torch.dtype,
            rows: slice | None = None, cols: slice | None = None) -> Tensor:
        """The tensor `key` (its `rows`/`cols` only: nothing else is read), dequantised where
        stored in block FP8, as `dtype` on `device`."""
        t = self._read(key, rows, cols)
        if key in self.fp8:
            t = t.float() * self._scales(key, rows, cols, t.shape)
        return t.to(device=device, dtype=dtype)

    def pair(self, key: str, rows: slice | None = None, cols: slice | None = None) -> Pair:
        """(e4m3 data, float32 scale per element) of `key`'s rows x cols, as stored; a float
        matrix is quantized here, on the block grid of the whole matrix
        (`checkpoint_fp8`)."""
        if key in self.fp8:
            t = self._read(key, rows, cols)
            return t, self._scales(key, rows, cols, t.shape)
        (bo, bi), shape = self.block, self.shapes[key]
        r0, c0, r1, c1 = *_starts(rows, cols), *_stops(rows, cols, shape)
        # The blocks around the slice, quantized whole, then cut back to it.
        around = self._read(key, slice(r0 // bo * bo, r1), slice(c0 // bi * bi, c1))
        data, scales = quantize_matrix(around[None], self.block)
        full = expand_scales(scales, self.block, *around.shape)[0]
        cut = (slice(r0 % bo, None), slice(c0 % bi, None))
        return data[0][cut], full[cut]

    def _read(self, key: str, rows: slice | None, cols: slice | None) -> Tensor:
        whole = slice(None)
        part = self.where[key].get_slice(key)
        return part[rows or whole] if cols is None else part[rows or whole, cols]

    def _scales(self, key: str, rows: slice | None, cols: slice | None,
                shape: tuple[int, ...]) -> Tensor:
        """The per-element scales of the stored block-FP8 `key`'s rows x cols."""
        (r0, c0), (bo, bi), (n_rows, n_cols) = _starts(rows, cols), self.block, shape
        blocks = self.where[key + SCALE_SUFFIX].get_slice(key + SCALE_SUFFIX)
        scale = blocks[r0 // bo:-(-(r0 + n_rows) // bo), c0 // bi:-(-(c0 + n_cols) // bi)]
        scale = scale.float().repeat_interleave(bo, 0)[r0 % bo:][:n_rows]
        return scale.repeat_interleave(bi, 1)[:, c0 % bi:][:, :n_cols]


def _starts(rows: slice | None, cols: slice | None) -> tuple[int, int]:
    return (rows.start or 0) if rows else 0, (cols.start or 0) if cols else 0


def _stops(rows: slice | None, cols: slice | None, shape: tuple[int, ...]) -> tuple[int, int]:
    return (rows.stop if rows and rows.stop is not None else shape[0],
            cols.stop if cols and cols.stop is not None else shape[1])
