"""Paged absorbed MLA decode in Triton: split-KV over the latent cache, then an LSE merge.

Math (DeepSeek-V2, arXiv:2405.04434, 2.1 and appendix C): with q_lat = q_nope . W_UK per head,
scores are [q_lat, q_pe] . [c_kv, k_pe] over the cached 576-wide rows, o_lat = softmax . c_kv,
and o = o_lat . W_UV^T. The split-KV scheme and the log-sum-exp merge follow FlashDecoding
(Dao et al., 2023) and FlashMLA; the paged layout follows vLLM's PagedAttention.

One program owns (head block, split, query row): it loads each KV tile [BLOCK_N, latent] once
and scores all BLOCK_H heads against it, so at 16 heads the cache is read once, and at 128 heads
the head blocks of one tile run next to each other (head block is the fastest grid axis) and
share it through L2. Row t sees keys 0..positions[t] of sequence token_seq[t], read on the
device, so one kernel serves decodes and short extends; padded rows (position 0, scratch page)
read one key and are harmless.

Graph safety: the split count comes from `plan_decode(rows, capacity, num_sms)`, a function of
tensor shapes only (rows in the bucket, page-table capacity), never of host-read lengths; each
split covers a device-computed chunk of its row's real length, and empty splits write nothing
the merge reads. Workspace buffers live in a `DecodeWorkspace` the backend owns, allocated at
the first (warm-up) call per shape and reused, so replays see the same addresses.
"""

import math
from dataclasses import dataclass, replace
from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor
from triton.runtime.errors import OutOfResources

# Splits never exceed this (workspace and merge cost grow with it).
MAX_SPLITS = 128
# A launch grid is "full" when it keeps this share of the SMs busy in its last wave.
FILL = 0.85


@dataclass(frozen=True)
class DecodePlan:
    """Launch shape of one decode bucket: fixed at capture, reused at every replay."""

    num_splits: int
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def plan_decode(
    num_rows: int, max_seq_len: int, num_sms: int, heads: int = 16,
    block_h: int | None = None, block_n: int | None = None, waves: int = 2,
) -> DecodePlan:
    """The launch shape for `num_rows` query rows (the bucket) whose keys may reach
    `max_seq_len` (the cache capacity of one sequence, not any real length): the fewest splits
    that keep `waves` programs per SM busy, at most one per key block of the capacity.

    Tiles: 16 heads x 32 keys x 576 (4 warps) as in the common Triton MLA kernel, which holds
    its registers; 64 heads per program above 16 heads, so a KV tile serves 64 heads per read
    and the two head blocks of V3's 128 share it through L2. `scripts/bench_kernels.py
    --sweep` measures the alternatives. Two waves: on an H200 (2026-11-21, H=16, ctx 4096)
    about 2 programs per SM were fastest at B=8, 32 and 128 (one wave left B=128 at 1.6x the
    time of two; more than two gained nothing)."""
    if block_h is None:
        block_h = 16 if heads <= 16 else 64
    if block_n is None:
        block_n = 32
    num_warps = 4 if block_h <= 16 else 8
    base = max(1, num_rows) * _cdiv(heads, block_h)
    most = max(1, min(MAX_SPLITS, _cdiv(max(1, max_seq_len), block_n)))
    slots = num_sms * waves
    splits = most
    for s in range(1, most + 1):
        programs = base * s
        if programs / (_cdiv(programs, slots) * slots) >= FILL:
            splits = s
            break
    return DecodePlan(splits, block_h, block_n, num_warps, num_stages=2)


class DecodeWorkspace:
    """Buffers for the absorbed query, the latent output and the split partials.

    Owned by a backend object (not per-step data). Every launch shape takes a view at offset 0
    of one flat buffer per role, so captured buckets share one allocation per role, the size
    of the largest (capture largest first, as vLLM and nano-vllm do). A buffer is only ever
    replaced by a larger one and the old one is kept alive, so a graph captured on it stays
    valid. The first call for a shape is the warm-up before capture. (One buffer per role, not
    one for all: the Triton interpreter copies each argument's whole storage back.)
    """

    def __init__(self) -> None:
        self._flat: dict[tuple[str, str, torch.dtype], Tensor] = {}
        self._retired: list[Tensor] = []

    def _take(self, role: str, device: torch.device, dtype: torch.dtype, shape: tuple) -> Tensor:
        key = (role, str(device), dtype)
        numel = math.prod(shape)
        flat = self._flat.get(key)
        if flat is None or flat.numel() < numel:
            if flat is not None:
                self._retired.append(flat)
            flat = self._flat[key] = torch.empty(numel, device=device, dtype=dtype)
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


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _split_kernel(
    q_lat, q_pe, cache, page_table, token_seq, positions, part_o, part_lse, out,
    sq_h, sq_t, sp_t, sp_h, s_row, s_pt, so_h, so_t,
    heads, kv_lora, rope, page_size, max_pages, scale_log2, num_splits,
    SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
):
    hb = tl.program_id(0)
    split = tl.program_id(1)
    t = tl.program_id(2).to(tl.int64)
    seq = tl.load(token_seq + t).to(tl.int64)
    kv_len = tl.load(positions + t).to(tl.int32) + 1
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, kv_len)

    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    c = tl.arange(0, BLOCK_C)
    r = tl.arange(0, BLOCK_R)
    hm = h < heads
    cm = c < kv_lora
    rm = r < rope
    q = tl.load(q_lat + h[:, None] * sq_h + t * sq_t + c[None, :],
                mask=hm[:, None] & cm[None, :], other=0.0)
    qp = tl.load(q_pe + t * sp_t + h[:, None] * sp_h + r[None, :],
                 mask=hm[:, None] & rm[None, :], other=0.0)
    q = q.to(cache.dtype.element_ty)
    qp = qp.to(cache.dtype.element_ty)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nm = n < end
        slot = n // page_size
        # A row past its page table reads the scratch page instead of another row's pages.
        page = tl.load(page_table + seq * s_pt + slot, mask=nm & (slot < max_pages), other=0)
        row = page.to(tl.int64) * page_size + n % page_size
        kv = tl.load(cache + row[:, None] * s_row + c[None, :],
                     mask=nm[:, None] & cm[None, :], other=0.0)
        kp = tl.load(cache + row[:, None] * s_row + kv_lora + r[None, :],
                     mask=nm[:, None] & rm[None, :], other=0.0)
        s = tl.dot(q, tl.trans(kv)) + tl.dot(qp, tl.trans(kp))
        s = tl.where(nm[None, :], s * scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv)
        m = m_new

    safe = tl.where(lsum > 0, lsum, 1.0)
    o = acc / safe[:, None]
    if not SPLIT:
        tl.store(out + h[:, None] * so_h + t * so_t + c[None, :],
                 o.to(out.dtype.element_ty), mask=hm[:, None] & cm[None, :])
    else:
        # A tensor, not a scalar: the interpreter rejects scalar-and-tensor masks.
        live = (h * 0 + start) < kv_len
        base = (t * heads + h) * num_splits + split
        lse = tl.where(lsum > 0, m + tl.log2(safe), float("-inf"))
        tl.store(part_lse + base, lse, mask=hm & live)
        tl.store(part_o + base[:, None] * kv_lora + c[None, :], o,
                 mask=(hm & live)[:, None] & cm[None, :])


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _merge_kernel(
    part_o, part_lse, positions, out, so_h, so_t, heads, kv_lora, num_splits,
    SPLITS_P2: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kv_len = tl.load(positions + t).to(tl.int32) + 1
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    active = tl.cdiv(kv_len, chunk)
    base = (t * heads + h) * num_splits
    sidx = tl.arange(0, SPLITS_P2)
    lse = tl.load(part_lse + base + sidx, mask=sidx < active, other=float("-inf"))
    top = tl.max(lse, 0)
    total = tl.sum(tl.exp2(lse - top), 0)
    c = tl.arange(0, BLOCK_C)
    cm = c < kv_lora
    acc = tl.zeros([BLOCK_C], tl.float32)
    for s in range(0, active):
        w = tl.exp2(tl.load(part_lse + base + s) - top)
        acc += w * tl.load(part_o + (base + s) * kv_lora + c, mask=cm, other=0.0)
    tl.store(out + h * so_h + t * so_t + c, (acc / total).to(out.dtype.element_ty), mask=cm)


_SHRUNK: dict[DecodePlan, DecodePlan] = {}


def effective_plan(plan: DecodePlan) -> DecodePlan:
    """The plan launches really use: `plan`, or a smaller tiling if it ran out of resources."""
    return _SHRUNK.get(plan, plan)


def _smaller(plan: DecodePlan) -> DecodePlan | None:
    """A plan that needs less shared memory (same splits, so the workspace is unchanged)."""
    if plan.num_stages > 1:
        return replace(plan, num_stages=1)
    if plan.block_n > 16:
        return replace(plan, block_n=plan.block_n // 2, num_stages=2)
    return None


def mla_decode(
    q_lat: Float[Tensor, "heads tokens kv_lora"],
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    cache: Float[Tensor, "pages page_size latent"],
    page_table: Int[Tensor, "seqs max_pages"],
    token_seq: Int[Tensor, " tokens"],
    positions: Int[Tensor, " tokens"],
    scale: float,
    plan: DecodePlan,
    out: Float[Tensor, "heads tokens kv_lora"],
    part_o: Float[Tensor, "tokens heads _ kv_lora"],
    part_lse: Float[Tensor, "tokens heads _"],
) -> Float[Tensor, "heads tokens kv_lora"]:
    """o_lat[h, t] = softmax over keys 0..positions[t] of sequence token_seq[t]; into `out`."""
    heads, tokens, kv_lora = q_lat.shape
    rope = q_pe.shape[-1]
    assert q_lat.stride(-1) == 1 and q_pe.stride(-1) == 1 and out.stride(-1) == 1
    assert cache.stride(-1) == 1 and cache.stride(0) == cache.shape[1] * cache.stride(1)
    plan = effective_plan(plan)
    while True:
        try:
            _launch(q_lat, q_pe, cache, page_table, token_seq, positions, scale, plan, out,
                    part_o, part_lse, heads, tokens, kv_lora, rope)
            return out
        except OutOfResources:
            smaller = _smaller(plan)
            if smaller is None:
                raise
            _SHRUNK[plan] = plan = smaller


def _launch(q_lat, q_pe, cache, page_table, token_seq, positions, scale, plan, out, part_o,
            part_lse, heads, tokens, kv_lora, rope) -> None:
    splits = plan.num_splits
    grid = (_cdiv(heads, plan.block_h), splits, tokens)
    _split_kernel[grid](
        q_lat, q_pe, cache, page_table, token_seq, positions, part_o, part_lse, out,
        q_lat.stride(0), q_lat.stride(1), q_pe.stride(0), q_pe.stride(1), cache.stride(1),
        page_table.stride(0), out.stride(0), out.stride(1),
        heads, kv_lora, rope, cache.shape[1], page_table.shape[1], scale * 1.4426950408889634,
        splits,
        SPLIT=splits > 1, BLOCK_H=plan.block_h, BLOCK_N=plan.block_n,
        BLOCK_C=triton.next_power_of_2(kv_lora), BLOCK_R=max(16, triton.next_power_of_2(rope)),
        num_warps=plan.num_warps, num_stages=plan.num_stages,
    )
    if splits > 1:
        assert part_o.shape[2] == splits and part_lse.shape[2] == splits
        _merge_kernel[(tokens, heads)](
            part_o, part_lse, positions, out, out.stride(0), out.stride(1), heads, kv_lora,
            splits, SPLITS_P2=triton.next_power_of_2(splits),
            BLOCK_N=plan.block_n, BLOCK_C=triton.next_power_of_2(kv_lora), num_warps=4,
        )


def num_sms(device: torch.device) -> int:
    """SMs of a CUDA device; a small stand-in elsewhere (the interpreter has no SMs)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def attend_absorbed(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    cache: Float[Tensor, "pages page_size latent"],
    w_uk: Float[Tensor, "heads qk_nope kv_lora"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    token_seq: Int[Tensor, " tokens"],
    positions: Int[Tensor, " tokens"],
    page_table: Int[Tensor, "seqs max_pages"],
    scale: float,
    workspace: DecodeWorkspace,
    plan: DecodePlan | None = None,
) -> Float[Tensor, "tokens heads v_head"]:
    """The absorbed form (same contract as mla_func.ops.attention.attend_absorbed). Without a
    plan, it is chosen from shapes only: rows and the page table's capacity."""
    tokens, heads, _ = q_nope.shape
    kv_lora = w_uk.shape[-1]
    if plan is None:
        capacity = page_table.shape[1] * cache.shape[1]
        plan = plan_decode(tokens, capacity, num_sms(q_nope.device), heads)
    dtype = cache.dtype
    q_lat, o_lat, part_o, part_lse = workspace.get(
        q_nope.device, dtype, tokens, heads, kv_lora, plan.num_splits)
    torch.bmm(q_nope.transpose(0, 1).to(dtype), w_uk.to(dtype), out=q_lat)
    mla_decode(q_lat, q_pe, cache, page_table, token_seq, positions, scale, plan, o_lat,
               part_o, part_lse)
    o = torch.bmm(o_lat, w_uv.to(dtype).transpose(1, 2))
    return o.transpose(0, 1).to(q_nope.dtype).contiguous()
