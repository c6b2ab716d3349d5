"""kernels/collective/push_sum in the interpreter: the ranks' buffers are ordinary tensors and
each rank's launch runs in turn, the last rank first. A rank's launch finds the rows of the
ranks after it already pushed by their launches; the rows of the ranks not yet run are
written into its buffer first as their launches would (`pushed`). Checked: the sums and the
sub-layer end bitwise against the reference, the buffers' layout (slot per sender, half per
phase), -0.0 sent as +0.0, every read row emptied again, the phase flipped per launch.
Two GPUs run it over symmetric memory: tests/test_parallel_cuda.py."""

import pytest
import torch

from mla_func.kernels.collective import push_sum
from mla_func.kernels.linear.norm import add_rmsnorm

pytestmark = pytest.mark.interpret

SLOT = 4224  # elements a sender's slot holds (a multiple of 16 bytes for 2 and 4)


def pushed(x: torch.Tensor) -> torch.Tensor:
    """x's rows as a peer's buffer holds them: flat, -0.0 as +0.0."""
    flat = x.reshape(-1).clone()
    flat[(flat == 0) & flat.signbit()] = 0.0
    return flat


def empty_bits(dtype: torch.dtype) -> int:
    return int(torch.tensor(-0.0, dtype=dtype).view(_int(dtype)))


class Ranks:
    """`world` ranks' push buffers, their address array and phases."""

    def __init__(self, world: int, dtype: torch.dtype):
        self.world = world
        self.bufs = [push_sum.empty_buffer(torch.empty(push_sum.buffer_elements(SLOT, world),
                                                       dtype=dtype)) for _ in range(world)]
        self.ptrs = torch.tensor([b.data_ptr() for b in self.bufs], dtype=torch.int64)
        self.phases = [torch.zeros(2, dtype=torch.int32) for _ in range(world)]

    def slot(self, rank: int, half: int, sender: int) -> torch.Tensor:
        return self.bufs[rank][(half * self.world + sender) * SLOT:][:SLOT]

    def launch(self, xs: list[torch.Tensor], fn) -> list:
        """fn(rank, x, buffer args) on every rank, the last rank first."""
        half = int(self.phases[0][0])
        outs: list = [None] * self.world
        for q in reversed(range(self.world)):
            assert int(self.phases[q][0]) == half
            for r in range(q):  # ranks not yet run: what their launches will push
                self.slot(q, half, r)[:xs[r].numel()].copy_(pushed(xs[r]))
            outs[q] = fn(q, xs[q], self.bufs[q], self.ptrs.data_ptr(), q, self.world,
                         self.phases[q])
            assert int(self.phases[q][0]) == 1 - half and int(self.phases[q][1]) == 0
        return outs

    def check_layout(self, xs: list[torch.Tensor], half: int) -> None:
        """Rows read are empty again; rows pushed after their reader ran (here only) sit in
        its slot of this launch's half."""
        bits = empty_bits(self.bufs[0].dtype)
        for q in range(self.world):
            for r in range(self.world):
                got = self.slot(q, half, r)
                if r < q:  # pushed by rank r's launch, after rank q had run
                    n = xs[r].numel()
                    want = pushed(xs[r]).view(_int(got.dtype))
                    assert torch.equal(got[:n].view(_int(got.dtype)), want), (q, r)
                else:  # read and emptied (or never written: its own slot), in either half
                    assert (got.view(_int(got.dtype)) == bits).all(), (q, r)
                    other = self.slot(q, 1 - half, r)
                    assert (other.view(_int(got.dtype)) == bits).all(), (q, r)


def _int(dtype: torch.dtype) -> torch.dtype:
    """The signed integer dtype of `dtype`'s size (its bits, as the kernel compares them)."""
    return {2: torch.int16, 4: torch.int32}[dtype.itemsize]


def _inputs(world: int, rows: int, width: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(rows, width, generator=g).to(dtype) for _ in range(world)]
    for x in xs:  # -0.0 and +0.0 among the values, and one element -0.0 on every rank
        x.view(-1)[1::7] = -0.0
        x.view(-1)[3::11] = 0.0
        x[0, 0] = -0.0
    h = torch.randn(rows, width, generator=g).to(dtype)
    w = (torch.rand(width, generator=g) + 0.5).to(dtype)
    return xs, h, w


def _reference_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    total = torch.zeros(xs[0].shape, dtype=torch.float32)
    for x in xs:
        total += x.float()
    return total.to(xs[0].dtype)


@pytest.mark.parametrize("world,rows,width,dtype", [
    (2, 3, 48, torch.float16), (2, 130, 16, torch.float16), (4, 5, 40, torch.float32),
    (3, 2, 2048, torch.float16), (8, 2, 24, torch.float32)])
def test_push_sum_and_sub_layer_end(world, rows, width, dtype):
    """A sub-layer end (sum, residual add, norm) in the first half, then a plain sum of other
    rows in the second, then one in the first again: the reference's bits each time, the
    same on every rank. Float16 and float32: the interpreter rounds float32 to bfloat16 by
    truncation (the GPU to nearest); two GPUs check bfloat16 bitwise."""
    ranks = Ranks(world, dtype)
    xs, h, w = _inputs(world, rows, width, dtype, seed=world * 100 + rows)
    outs = ranks.launch(xs, lambda q, x, *buf: push_sum.push_all_reduce_add_rmsnorm(
        x, h, w, 1e-6, *buf))
    want = add_rmsnorm(h, _reference_sum(xs), w, 1e-6)
    for q, got in enumerate(outs):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), q
        assert all(torch.equal(a, b) for a, b in zip(got, outs[0], strict=True)), q
    ranks.check_layout(xs, half=0)
    for half, seed in ((1, 7), (0, 8)):
        xs, _, _ = _inputs(world, max(rows - 1, 1), width, dtype, seed=seed)
        outs = ranks.launch(xs, lambda q, x, *buf: push_sum.push_all_reduce(x, *buf))
        want = _reference_sum(xs)
        assert all(torch.equal(got, want) and torch.equal(got, outs[0]) for got in outs)
        assert not any(got.signbit()[0, 0] for got in outs)  # -0.0 everywhere sums to +0.0
        ranks.check_layout(xs, half=half)


def test_push_sum_refuses_rows_its_slots_cannot_hold():
    """Rows past a slot, or of another dtype than the buffer's: a ValueError before any
    launch. No rows: nothing launched, the phase as it was."""
    ranks = Ranks(2, torch.bfloat16)
    args = (ranks.bufs[0], ranks.ptrs.data_ptr(), 0, 2, ranks.phases[0])
    assert push_sum.push_all_reduce(torch.zeros(0, 16, dtype=torch.bfloat16), *args).shape == (
        0, 16) and not ranks.phases[0].any()
    with pytest.raises(ValueError, match="cannot take 3 x 2048 rows"):
        push_sum.push_all_reduce(torch.zeros(3, 2048, dtype=torch.bfloat16), *args)
    with pytest.raises(ValueError, match="cannot take"):
        push_sum.push_all_reduce(torch.zeros(1, 8, dtype=torch.float32), *args)
