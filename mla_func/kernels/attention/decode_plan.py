"""Launch plans and workspace of the absorbed MLA decode (`mla_decode`): host-side, shapes only.

`plan_decode` picks a `DecodePlan` (split count, tiling, kernel variants) from static shapes --
rows in the bucket, page-table capacity, SM count -- never from host-read lengths, so a CUDA
graph captured with one plan replays for any lengths. `DecodeWorkspace` owns the buffers the
decode writes besides its output: allocated at the first (warm-up) call per shape, only ever
grown, so captured graphs keep valid addresses.
"""

import math
import warnings
from dataclasses import dataclass, replace

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.kernels.launch.pdl import supported as pdl_supported

# The decode kernels' operands (`mla_decode`, `mla_decode_ws`), spelled once (the cache's is
# `ops.attention.CacheLayer`).
LatentRows = Float[Tensor, "heads tokens kv_lora"]  # q_lat in, o_lat out
RopeRows = Float[Tensor, "tokens heads qk_rope"]  # q_pe
PageTable = Int[Tensor, "seqs max_pages"]
RowIndex = Int[Tensor, " tokens"]  # token_seq, positions
PartialO = Float[Tensor, "tokens heads _ kv_lora"]  # per split (fp32)
PartialLse = Float[Tensor, "tokens heads _"]

# Splits never exceed this (workspace and merge cost grow with it).
MAX_SPLITS = 128
# A launch grid is "full" when it keeps this share of the SMs busy in its last wave.
FILL = 0.85
# The merge warms L2 with W_UV (`DecodePlan.warm`) up to this many rows; from 32 rows it gained
# nothing or lost (docs/DECISIONS.md, `decode_plan.WARM_MAX_ROWS`).
WARM_MAX_ROWS = 8
# The merge multiplies by W_UV itself (`DecodePlan.uv`, merge_uv.py) up to this many rows
# (its programs read W_UV again per row: from 8 rows merge + bmm is faster; docs/DECISIONS.md,
# `decode_plan.UV_MAX_ROWS`).
UV_MAX_ROWS = 4
# ... and up to this many heads: its programs read W_UV once a row, and at 128 heads (16 MB of
# W_UV) merge + bmm was faster at every row count (docs/DECISIONS.md, `decode_plan.UV_MAX_HEADS`;
# the Triton plan at 128 heads runs the same merge kernels and was not timed apart).
UV_MAX_HEADS = 16
# The warp-specialised kernel (`DecodePlan.ws`) from this many keys a split: its programs load
# 64 heads' queries and set up three partitions first (docs/DECISIONS.md,
# `decode_plan.WS_MIN_KEYS`).
WS_MIN_KEYS = 64
# The warp-specialised kernel launches early behind the absorb kernel (`DecodePlan.early`: its
# loader loads the first tiles of old rows, then waits) up to this many rows; from 8 rows it was
# even or slower (docs/DECISIONS.md, `decode_plan.WS_EARLY_MAX_ROWS`).
WS_EARLY_MAX_ROWS = 4
# Two waves of split programs (`waves`) only where each split may cover this many keys of the
# capacity; shorter splits fill one wave (16 heads a program; where the capacity, not the
# fill, bounds the splits, as at a few rows, nothing changes). Short splits' fixed work (the
# query loads, the fp32 partials of every head, the merge's reads of them) outweighs the
# second wave's overlap (docs/DECISIONS.md, `decode_plan.TWO_WAVE_KEYS`).
TWO_WAVE_KEYS = 256
# decode_fp8.py's float16 products (`DecodePlan.f16`) from this many rows: at 1 row (32-128
# splits of a tile or a few each) bringing the query into float16's range costs more than
# the conversions save (docs/DECISIONS.md, `decode_plan.F16_MIN_ROWS`).
F16_MIN_ROWS = 32


@dataclass(frozen=True)
class DecodePlan:
    """Launch shape of one decode bucket: fixed at capture, reused at every replay."""

    num_splits: int
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    shared_p: bool = False  # score -> value product through scratch: no duplicate score tile
    early: bool = False  # sm90: launch while the absorb kernel runs, warm L2, then wait
    warm: bool = False  # the merge, launched early, warms L2 with W_UV before it waits
    uv: bool = False  # the merge fused with the W_UV product (mla_merge_uv): no o_lat
    # sm90, 64 heads a program: the warp-specialised Gluon split kernel (decode_ws.py), where
    # it takes the cache (`mla_decode_ws.supported`: bf16, 576-wide rows); the Triton kernel
    # runs the plan elsewhere.
    ws: bool = False
    # The cache is FP8 (`cache_fp8`): never `ws` (decode_ws.py reads bf16 rows only).
    fp8: bool = False
    # With `fp8`: decode_fp8.py's split kernel, the rows' group scales on the scores and the
    # probabilities (16 heads a program); else the Triton kernel dequantises its tiles.
    group_scores: bool = False
    # With `group_scores`: the latent products in float16, to which e4m3 converts in one
    # instruction a value pair (bf16 takes three), the query moved into its range.
    f16: bool = False


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def plan_decode(
    num_rows: int, max_seq_len: int, num_sms: int, heads: int = 16, page_size: int = 64,
    ws: bool = False, fp8: bool = False, dtype: torch.dtype = torch.bfloat16,
) -> DecodePlan:
    """The launch shape for `num_rows` query rows (the bucket) whose keys may reach
    `max_seq_len` (the cache capacity of one sequence, not any real length): the fewest splits
    that keep two programs per SM busy, at most one per key block of the capacity; one
    wave where the splits would cover fewer than TWO_WAVE_KEYS keys (16 heads a program).

    Tiles: 16 heads x 32 keys x 576 (4 warps); 64 heads per program (8 warps) above 16 heads,
    so a KV tile serves 64 heads per read and the two head blocks of V3's 128 share it through
    L2. Two waves: on an H200 (2026-11-21, H=16, ctx 4096) about 2 programs per SM were
    fastest at B=8, 32 and 128. Variants, from the H200 sweep of 2026-11-22
    (`scripts/bench_kernels.py --sweep-only`, docs/DECISIONS.md): one page entry per tile with the
    next tile's entry prefetched (a dependent load per tile otherwise stalls each iteration;
    split kernel 1.25-1.4x faster), 3 stages, and 64-key tiles at 2 stages where a split may
    cover 2048 keys or more (H=16, B=128, ctx 4096: 165 vs 172 us; shorter splits lose with
    64, and so do pages under 64 keys, where tiles gather per key: page 1, H=16, B=128, ctx
    4096: 232 us with 64-key tiles, 194 us with the first version's 32-key plan). At 64 heads
    per program 64-key tiles at 2 stages from 1024 keys a split (docs/DECISIONS.md, `plan_decode`
    64-key tiles; shorter splits, B=1 and pages under 64 keys were not measured and keep 32-key
    tiles at 3 stages). The merge launches as a programmatic dependent of the split kernel
    (sm90+): about 1 us less at B=1, the same elsewhere. 64-head programs hand p to the value
    product through scratch (`shared_p`, 64-key tiles) where that measured faster
    (`_shared_p_pays`). `early`: on sm90 the split kernel launches while the absorb kernel
    runs and warms L2 with its first cache rows, and, up to WARM_MAX_ROWS rows, the merge,
    launched while the split kernel runs, warms it with W_UV (decode.py); up to UV_MAX_ROWS
    rows the merge multiplies by W_UV itself (`uv`, merge_uv.py). The early launches' measurement:
    docs/DECISIONS.md, `DecodePlan.early`.

    `ws`: the device runs the warp-specialised kernel (decode_ws.py, sm90): above 16
    heads the plan is `_ws_plan`'s where its splits cover WS_MIN_KEYS keys or more. `fp8`:
    the cache is FP8 (`cache_fp8`): a Triton plan whatever `ws` (decode_ws.py reads bf16
    rows), at up to 16 heads decode_fp8.py's (`_fp8_plan`), its latent products in float16
    from F16_MIN_ROWS rows of queries in a 16-bit `dtype` (as exact as bf16's or more), in
    `dtype` otherwise."""
    if fp8:
        plan = _fp8_plan(num_rows, max_seq_len, num_sms, heads, page_size)
        f16 = plan.group_scores and dtype.itemsize == 2 and num_rows >= F16_MIN_ROWS
        return replace(plan, f16=f16)
    if ws and heads > 16:
        plan = _ws_plan(num_rows, max_seq_len, num_sms, heads)
        if max_seq_len >= WS_MIN_KEYS * plan.num_splits:
            return plan
    block_h = 16 if heads <= 16 else 64
    num_warps = 4 if block_h <= 16 else 8
    most = max(1, min(MAX_SPLITS, _cdiv(max(1, max_seq_len), 32)))
    programs = max(1, num_rows) * _cdiv(heads, block_h)
    splits = _fill_splits(programs, most, num_sms * 2)
    filled = programs * splits >= FILL * num_sms * 2  # not bound by the capacity
    if block_h <= 16 and filled and max_seq_len < TWO_WAVE_KEYS * splits:
        splits = _fill_splits(programs, most, num_sms)
    shared_p = block_h > 16 and _shared_p_pays(splits, max_seq_len)
    if shared_p and splits == 1:
        splits = 2
    long_keys = 2048 if block_h <= 16 else 1024
    long_splits = max_seq_len / splits >= long_keys and page_size % 64 == 0
    block_n = 64 if long_splits or shared_p else 32
    stages = 3 if block_n < 64 else 2  # 64-key tiles: a third stage does not fit at 64 heads
    return DecodePlan(splits, block_h, block_n, num_warps, num_stages=stages,
                      shared_p=shared_p, early=True, warm=num_rows <= WARM_MAX_ROWS,
                      uv=num_rows <= UV_MAX_ROWS and heads <= UV_MAX_HEADS)


def _fp8_plan(num_rows: int, max_seq_len: int, num_sms: int, heads: int, page_size: int
              ) -> DecodePlan:
    """An FP8 cache's plan. Up to 16 heads: decode_fp8.py's kernel (`group_scores`), 32-key
    tiles in 3 stages (94 KB of shared memory; 4 stages leave one program an SM) and the
    fewest splits that fill two programs an SM, also where they cover few keys. Above: the
    Triton kernel's 64-head plan, its tiles dequantised (docs/DECISIONS.md,
    `decode_plan._fp8_plan`)."""
    if heads > 16:
        plan = plan_decode(num_rows, max_seq_len, num_sms, heads, page_size)
        return replace(plan, fp8=True)
    most = max(1, min(MAX_SPLITS, _cdiv(max(1, max_seq_len), 32)))
    splits = _fill_splits(max(1, num_rows), most, num_sms * 2)
    return DecodePlan(splits, 16, 32, num_warps=4, num_stages=3, early=True,
                      warm=num_rows <= WARM_MAX_ROWS,
                      uv=num_rows <= UV_MAX_ROWS and heads <= UV_MAX_HEADS, fp8=True,
                      group_scores=True)


def _fill_splits(programs_per_split: int, most: int, slots: int) -> int:
    """The fewest splits (at most `most`) whose programs keep FILL of `slots` busy in their last
    wave; `most` if none does."""
    for s in range(1, most + 1):
        programs = programs_per_split * s
        if programs / (_cdiv(programs, slots) * slots) >= FILL:
            return s
    return most


def _ws_plan(num_rows: int, max_seq_len: int, num_sms: int, heads: int) -> DecodePlan:
    """The warp-specialised kernel's plan: 32-key tiles in 4 stages (230 KB of shared
    memory: one program a SM), the fewest splits that fill one wave: one wave was fastest
    wherever it was measured (docs/DECISIONS.md, `decode_plan._ws_plan`)."""
    block_n = 32
    most = max(1, min(MAX_SPLITS, _cdiv(max(1, max_seq_len), block_n)))
    splits = _fill_splits(max(1, num_rows) * _cdiv(heads, 64), most, num_sms)
    return DecodePlan(splits, 64, block_n, num_warps=4, num_stages=4, ws=True,
                      early=num_rows <= WS_EARLY_MAX_ROWS, warm=num_rows <= WARM_MAX_ROWS,
                      uv=num_rows <= UV_MAX_ROWS and heads <= UV_MAX_HEADS)


def _shared_p_pays(splits: int, max_seq_len: int) -> bool:
    """Whether a 64-head plan of `splits` splits runs faster with `shared_p` (64-key tiles, a
    single split doubled): it paid from 256 keys a split, and lost where a single split stays
    and at 32 keys a split (docs/DECISIONS.md, `decode_plan._shared_p_pays`)."""
    keys = max_seq_len / splits
    if splits == 1:
        return max_seq_len >= 4096
    return keys >= 256


Shrunk = dict[DecodePlan, DecodePlan]  # plans that ran out of resources -> what runs instead


def effective_plan(plan: DecodePlan, shrunk: Shrunk) -> DecodePlan:
    """The plan launches really use: `plan`, or the smaller tiling `shrunk` records for it."""
    return shrunk.get(plan, plan)


def smaller_plan(plan: DecodePlan) -> DecodePlan | None:
    """A plan that needs less shared memory (same splits, so the workspace is unchanged)."""
    if plan.num_stages > 1:
        return replace(plan, num_stages=plan.num_stages - 1)
    if plan.block_n > 16:
        return replace(plan, block_n=plan.block_n // 2, num_stages=2)
    return None


def shrink(plan: DecodePlan, smaller: DecodePlan, shrunk: Shrunk) -> DecodePlan:
    """Record in `shrunk` that launches of `plan` run `smaller` (it ran out of resources);
    `smaller`. Said once per plan and record (a RuntimeWarning): the tiles that run are not
    the ones planned."""
    warnings.warn(f"the MLA decode split kernel ran out of GPU resources with {plan}; its "
                  f"launches use {smaller} instead", RuntimeWarning, stacklevel=3)
    shrunk[plan] = smaller
    return smaller


def pdl(plan: DecodePlan, device: torch.device) -> bool:
    """Programmatic dependent launch of the merge (sm90+), only where a merge follows."""
    return plan.num_splits > 1 and pdl_supported(device)


def shared_p_numel(plan: DecodePlan, rows: int, heads: int) -> tuple[int, int]:
    """Elements of plan.shared_p's scratch for `rows` query rows: two [block_h, block_n] tiles
    of p and two [block_h] vectors of alpha per split-kernel program."""
    programs = rows * _cdiv(heads, plan.block_h) * plan.num_splits
    return programs * 2 * plan.block_h * plan.block_n, programs * 2 * plan.block_h


class DecodeWorkspace:
    """Buffers for the absorbed query, the latent output and the split partials.

    Owned by the state's runtime, through its attention backend (not per-step data). Every launch
    shape takes a view at offset 0 of one flat buffer per role, so captured buckets share one
    allocation per role, the size of the largest (capture largest first, as vLLM and nano-vllm do).
    A buffer is only ever replaced by a larger one and the old one is kept alive, so a graph
    captured on it stays valid. The first call for a shape is the warm-up before capture. (One
    buffer per role, not one for all: the Triton interpreter copies each argument's whole storage
    back.)
    """

    def __init__(self) -> None:
        self._flat: dict[tuple[str, str, torch.dtype], Tensor] = {}
        self._retired: list[Tensor] = []
        self.shrunk: Shrunk = {}  # plans that ran out of resources on this device

    def effective(self, plan: DecodePlan) -> DecodePlan:
        """The plan the launches on this workspace run (`effective_plan`)."""
        return effective_plan(plan, self.shrunk)

    def _take(self, role: str, device: torch.device, dtype: torch.dtype, shape: tuple,
              zero: bool = False) -> Tensor:
        key = (role, str(device), dtype)
        numel = math.prod(shape)
        flat = self._flat.get(key)
        if flat is None or flat.numel() < numel:
            if flat is not None:
                self._retired.append(flat)
            make = torch.zeros if zero else torch.empty
            flat = self._flat[key] = make(numel, device=device, dtype=dtype)
        return flat[:numel].view(shape)

    def get(self, device: torch.device, dtype: torch.dtype, rows: int, heads: int,
            kv_lora: int, splits: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(q_lat [heads, rows, kv_lora], o_lat [heads, rows, kv_lora] in `dtype`,
        part_o [rows, heads, splits, kv_lora] and part_lse [rows, heads, splits] in fp32)."""
        parts = splits if splits > 1 else 0  # one split writes straight to o_lat
        f32 = torch.float32
        return (self._take("q_lat", device, dtype, (heads, rows, kv_lora)),
                self._take("o_lat", device, dtype, (heads, rows, kv_lora)),
                self._take("part_o", device, f32, (rows, heads, parts, kv_lora)),
                self._take("part_lse", device, f32, (rows, heads, parts)))

    def q_pe(self, device: torch.device, dtype: torch.dtype, rows: int, heads: int,
             rope: int) -> Tensor:
        """The rotated q_pe [rows, heads, rope] the fused prologue writes (absorb.py)."""
        return self._take("q_pe", device, dtype, (rows, heads, rope))

    def shared_p(self, device: torch.device, dtype: torch.dtype, rows: int, heads: int,
                 plan: DecodePlan) -> tuple[Tensor, Tensor]:
        """Scratch of plan.shared_p (`shared_p_numel`): p in `dtype`, alpha in fp32."""
        p_numel, a_numel = shared_p_numel(plan, rows, heads)
        return (self._take("p", device, dtype, (p_numel,)),
                self._take("alpha", device, torch.float32, (a_numel,)))

    def shares(self, device: torch.device, numel: int) -> Tensor:
        """fp32 scratch of the merge fused with W_UV (`mla_merge_uv`): its programs' shares of
        o, summed by the last of a row's programs."""
        return self._take("shares", device, torch.float32, (numel,))

    def counters(self, device: torch.device, n: int) -> Tensor:
        """n arrival counters for the merge fused with W_UV (`mla_merge_uv`), zero at
        allocation; each launch leaves them zero (the last program of a (row, head) resets its
        own)."""
        return self._take("counters", device, torch.int32, (n,), zero=True)


def num_sms(device: torch.device) -> int:
    """SMs of a CUDA device; a small stand-in elsewhere (the interpreter has no SMs)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
