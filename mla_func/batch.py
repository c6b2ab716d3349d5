"""Batch: the inputs of one step, and `make_batch` to build one from per-sequence work.

A step mixes decodes (one new token each) and prefills or prefill chunks (several new tokens
after a cached prefix); decode sequences come first. Tensors live on the model's device; the
`host` tensor lives on the CPU and carries the counts that kernels size their grids from, so that
no step ever reads device memory on the host. Each field's `pad` metadata is the value a padded
row gets when a batch is padded to a fixed size larger than it: padded rows write no cache slot
(-1), read only the scratch page, and have length 1 (never a zero-length dummy sequence).
"""

import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Int
from torch import Tensor

from mla_func.kernels.plan import KernelOptions, default_options, options_for
from mla_func.staging import HostStaging
from mla_func.state import SCRATCH_PAGE

__all__ = ["HOST_FIELDS", "Batch", "BatchError", "KernelOptions", "SeqWork", "check_vocab",
           "make_batch"]

HOST_FIELDS = ("num_tokens", "num_seqs", "num_decodes", "max_seq_len", "max_query_len")


def _pad(value: int) -> dict:
    return {"pad": value}


@dataclass(frozen=True)
class Batch:
    token_ids: Int[Tensor, " tokens"] = field(metadata=_pad(0))
    positions: Int[Tensor, " tokens"] = field(metadata=_pad(0))
    # Flat cache slot (page * page_size + offset) each new token is written to; -1: nowhere.
    slot_mapping: Int[Tensor, " tokens"] = field(metadata=_pad(-1))
    # Index (in this step) of the sequence each token belongs to.
    token_seq: Int[Tensor, " tokens"] = field(metadata=_pad(0))
    page_table: Int[Tensor, "seqs max_pages"] = field(metadata=_pad(SCRATCH_PAGE))
    # Cached + new tokens of each sequence after this step.
    seq_lens: Int[Tensor, " seqs"] = field(metadata=_pad(1))
    query_start: Int[Tensor, " seqs"] = field(metadata=_pad(0))
    query_lens: Int[Tensor, " seqs"] = field(metadata=_pad(0))
    # Row (token index) whose logits each sequence needs: its last new token.
    logits_index: Int[Tensor, " seqs"] = field(metadata=_pad(0))
    # CPU, never padded: the real counts, in the order of HOST_FIELDS.
    host: Int[Tensor, " 5"] = field(metadata={"host": True})
    # The cache page size the slots and page table were laid out for (forward checks it).
    page_size: int
    # Which implementation runs each op (`kernels.plan`); None: the device's defaults with
    # the torch attention backend.
    kernels: KernelOptions | None = None

    def __post_init__(self) -> None:
        if self.kernels is None:
            object.__setattr__(self, "kernels", default_options(self.token_ids.device))

    @property
    def backend(self) -> str:
        """The attention backend's name."""
        return self.kernels.attention

    def count(self, name: str) -> int:
        # tolist: a fifth of indexing's host time, read on every compiled step's dispatch.
        return self.host.tolist()[HOST_FIELDS.index(name)]

    @property
    def num_tokens(self) -> int:
        return self.count("num_tokens")

    @property
    def num_seqs(self) -> int:
        return self.count("num_seqs")

    @property
    def num_decodes(self) -> int:
        return self.count("num_decodes")

    @property
    def is_pure_decode(self) -> bool:
        return self.num_decodes == self.num_seqs


@dataclass(frozen=True)
class SeqWork:
    """One sequence's share of a step: new tokens after `start` cached ones, in `pages`."""

    token_ids: Sequence[int]
    start: int
    pages: Sequence[int]


class BatchError(ValueError):
    """A step's inputs that cannot be run."""


def token_id_error(ids: Sequence[int], seqs: Sequence[int], positions: Sequence[int],
                   vocab_size: int | None) -> BatchError | None:
    """The error naming the first id of `ids` (sequence `seqs[i]`, position `positions[i]`)
    outside [0, vocab_size), or, the vocabulary unknown, negative or past the batch's int32
    ids; None when every id is in range. Two C loops (min, max) when all are."""
    bound = vocab_size if vocab_size is not None else 2**31
    if not ids or (min(ids) >= 0 and max(ids) < bound):
        return None
    bad = [i for i, t in enumerate(ids) if not 0 <= t < bound]
    k, more = bad[0], f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    where = f"token id {ids[k]} (sequence {seqs[k]}, position {positions[k]})"
    if vocab_size is not None:
        return BatchError(f"{where} is outside the vocabulary [0, {vocab_size}){more}")
    if ids[k] < 0:
        return BatchError(f"{where} is negative{more}: ids index the vocabulary [0, vocab_size)")
    return BatchError(f"{where} does not fit the batch's int32 token ids{more}")


def check_vocab(batch: Batch, vocab_size: int) -> None:
    """A BatchError naming the first token id outside [0, vocab_size), checked where reading
    the ids costs no device sync: a batch on the CPU, run eagerly (not traced or compiled). A
    batch for a GPU is checked when it is made (`make_batch(vocab_size=...)`), and the engine
    checks each prompt when it is submitted."""
    ids = batch.token_ids
    if type(ids) is not Tensor or ids.device.type != "cpu" or torch.compiler.is_compiling():
        return
    low, high = torch.aminmax(ids)
    if low >= 0 and high < vocab_size:
        return
    raise token_id_error(ids.tolist(), batch.token_seq.tolist(), batch.positions.tolist(),
                         vocab_size)


def make_batch(
    work: Sequence[SeqWork],
    page_size: int,
    max_pages: int,
    device: "str | torch.device" = "cpu",
    backend: str = "torch",
    vocab_size: int | None = None,
    staging: HostStaging | None = None,
    kernels: KernelOptions | None = None,
) -> Batch:
    """Flatten per-sequence work (decodes first) into a Batch; checks token ids on the host:
    each in [0, vocab_size) (given; else >= 0 and an int32), a BatchError naming the first that
    is not, its sequence and position.
    `staging` (CUDA): the engine's pinned buffers for the copy (else one pinned per call).
    `kernels`: which implementation runs each op (default: the device's, with the attention
    `backend`)."""
    kernels = options_for(device, kernels, backend, error=BatchError)
    if not work:
        raise BatchError("a batch needs at least one sequence")
    tokens: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    token_seq: list[int] = []
    seq_lens, starts, qlens, last = [], [], [], []
    decodes, seen_prefill = 0, False
    for i, w in enumerate(work):
        n = len(w.token_ids)
        if n == 0:
            raise BatchError(f"sequence {i} has no new tokens")
        if w.start < 0:
            raise BatchError(f"sequence {i} starts at {w.start}: cached tokens cannot be < 0")
        if n == 1 and w.start > 0 and not seen_prefill:
            decodes += 1
        else:
            seen_prefill = True
            if n == 1 and w.start > 0:
                raise BatchError(f"decode sequence {i} comes after a prefill: decodes go first")
        total = w.start + n
        if -(-total // page_size) > len(w.pages):
            raise BatchError(f"sequence {i}: {total} tokens need more than {len(w.pages)} pages")
        if len(w.pages) > max_pages:
            raise BatchError(f"sequence {i} has {len(w.pages)} pages; max_pages is {max_pages}")
        if SCRATCH_PAGE in w.pages:
            raise BatchError(f"sequence {i} uses the scratch page {SCRATCH_PAGE}")
        starts.append(len(tokens))
        for j, tok in enumerate(w.token_ids):
            pos = w.start + j
            tokens.append(int(tok))
            positions.append(pos)
            slots.append(w.pages[pos // page_size] * page_size + pos % page_size)
            token_seq.append(i)
        qlens.append(n)
        seq_lens.append(total)
        last.append(len(tokens) - 1)
    error = token_id_error(tokens, token_seq, positions, vocab_size)
    if error is not None:
        raise error
    host = torch.tensor([len(tokens), len(work), decodes, max(seq_lens), max(qlens)],
                        dtype=torch.int64)
    # One host tensor and one copy for every device field: a transfer per field costs ~20 us
    # of host time each, a noticeable share of a decode step's host work at large batches.
    # Each field starts 16-byte aligned, as separate allocations would (Triton specialises
    # kernels on pointer alignment).
    fields = (tokens, positions, slots, token_seq, seq_lens, starts, qlens, last)
    buf, offsets = array.array("i"), []  # C ints: filled much faster than torch.tensor(list)
    for f in fields:
        offsets.append(len(buf))
        buf.extend(f)
        buf.extend([0] * (-len(f) % 4))
    # The page table last, row by row: each row's pages, then a slice of scratch entries
    # (copied as C ints). Built element by element, a table as wide as a whole cache (128
    # sequences x 1563 pages) cost ~9 ms of host time a step on the development CPU.
    table_at = len(buf)
    scratch = array.array("i", [SCRATCH_PAGE]) * max_pages
    for w in work:
        buf.extend(w.pages)
        buf.extend(scratch[: max_pages - len(w.pages)])
    flat = torch.frombuffer(buf, dtype=torch.int32)
    if len(buf) > table_at and int(flat[table_at:].min()) < SCRATCH_PAGE:  # one op, not a loop
        i, bad = next((i, [p for p in w.pages if p < 0]) for i, w in enumerate(work)
                      if any(p < 0 for p in w.pages))
        raise BatchError(f"sequence {i} has negative page id(s) {bad[:5]}: pages come from "
                         "the state's allocator")
    device = torch.device(device)
    if staging is not None:
        flat = staging.to_device(flat)
    elif device.type == "cuda":  # pinned: the copy is asynchronous and the buffer stays alive
        flat = flat.pin_memory().to(device, non_blocking=True)
    else:  # a copy: `flat` borrows the memory of `buf`
        flat = flat.to(device, copy=True)
    parts = [flat[at:at + len(f)] for at, f in zip(offsets, fields, strict=True)]
    table = flat[table_at:table_at + len(work) * max_pages].view(len(work), max_pages)
    return Batch(
        token_ids=parts[0], positions=parts[1], slot_mapping=parts[2], token_seq=parts[3],
        page_table=table, seq_lens=parts[4],
        query_start=parts[5], query_lens=parts[6], logits_index=parts[7], host=host,
        page_size=page_size, kernels=kernels,
    )
