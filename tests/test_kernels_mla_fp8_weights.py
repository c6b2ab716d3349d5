"""Block-FP8 W_UK / W_UV through the attention op (`AttnWeights.absorbed`): the Triton backend's
decode kernels read them as e4m3 (absorb.py, merge_uv.py); its other paths and the torch
backend dequantise them first. Every path gives the bits of the same op run on the weights
dequantised beforehand (`fp8.dequantize`), but one: the decode's merge multiplying by a W_UV
whose program columns lie in one scale block scales the e4m3 product once (each weight
exact, not rounded to the activations' dtype first), close to those bits. In the
interpreter on a CPU, compiled on a GPU (where these run on CUDA tensors)."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined (CPU only)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mla_helpers import DEV, SMALL, TOL, rel_err  # noqa: E402
from test_kernels_mla_prefill import CACHE_ARG, backend_case  # noqa: E402

from mla_func.batch import SeqWork  # noqa: E402
from mla_func.fp8 import Fp8Weight, dequantize, quantize_matrix  # noqa: E402
from mla_func.kernels.attention import absorbed as mla_absorbed  # noqa: E402
from mla_func.kernels.attention import decode_plan  # noqa: E402
from mla_func.kernels.launch.runtime import Runtime  # noqa: E402

UK, UV, SCALES, BLOCK = 7, 8, 12, 14  # where op_args holds them
# Block rows x columns: a head's 16 rows in one block (the kernels' W8 1, as V2's and V3's
# 128-row heads), with kv_lora's 32 columns in one block (merge_uv scales its product: its
# programs take 32 columns here) or in four (it dequantises a tile); two row blocks and two
# column blocks (a scale looked up an element: W8 2).
GRIDS = [(16, 32), (16, 8), (8, 16)]
GRID = GRIDS[2]
FLOATS = (0, 1, 2, CACHE_ARG, 5)  # q_nope, q_pe, kv, the cache, the latent norm


def _fp8(w: torch.Tensor, grid: tuple[int, int] = GRID) -> Fp8Weight:
    return Fp8Weight(*quantize_matrix(w, grid), grid, tuple(w.shape))


def _cases(args: list, dtype: torch.dtype, grid: tuple[int, int]) -> tuple[list, list]:
    """(the op's args with block-FP8 W_UK / W_UV, the same with them dequantised to dtype);
    the float operands in dtype."""
    args = [a.to(dtype) if i in FLOATS else a for i, a in enumerate(args)]
    uk, uv = _fp8(args[UK], grid), _fp8(args[UV], grid)
    fp8 = list(args)
    fp8[UK], fp8[UV], fp8[SCALES], fp8[SCALES + 1] = uk.data, uv.data, uk.scales, uv.scales
    fp8[BLOCK], fp8[BLOCK + 1] = grid
    dense = list(args)
    dense[UK], dense[UV] = dequantize(uk, dtype), dequantize(uv, dtype)
    return fp8, dense


def _run(args: list, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the op's output, the cache it wrote), on a copy of the cache a runtime owns."""
    a = list(args)
    a[CACHE_ARG] = cache = args[CACHE_ARG].clone()
    Runtime(DEV).own(cache)
    return torch.ops.mla_func.mla_attention(*a, backend), cache


WORK = {  # a pure decode step (the absorb + prologue launch), one with a 70-token prompt
    "decode": [SeqWork([1], 9, [1, 2, 3]), SeqWork([2], 3, [4]), SeqWork([7], 40, [5, 6, 7])],
    "prefill": [SeqWork([1], 9, [1, 2, 3]), SeqWork(list(range(70)), 0, list(range(5, 12)))],
}


# The half dtype the kernels run in: bf16 on a GPU; fp16 in the interpreter, whose `tl.dot`
# multiplies bf16 tiles' raw bits (Triton 3.9: triton-lang/triton#11584, bf16 unsupported).
HALF = torch.bfloat16 if torch.cuda.is_available() else torch.float16
# (backend, work, uv, dtype, grid): the Triton decode's merge with W_UV on every grid (and
# float32), its merge + bmm, a Triton prefill, the torch backend's both forms.
CASES = [("triton", "decode", True, torch.float32, GRIDS[0]),
         *[("triton", "decode", True, HALF, g) for g in GRIDS],
         ("triton", "decode", False, HALF, GRIDS[0]), ("triton", "prefill", True, HALF, GRIDS[2]),
         ("torch", "decode", True, HALF, GRIDS[2]), ("torch", "prefill", True, HALF, GRIDS[0])]


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("backend,work,uv,dtype,grid", CASES)
def test_fp8_absorbed_weights_against_their_dequantisation(backend, work, uv, dtype, grid,
                                                           monkeypatch):
    """The op on block-FP8 W_UK / W_UV against the op on their dequantisation: the same bits
    on every path (the decode's merge multiplying by W_UV itself, `uv`, or the bmm after it,
    a prefill), but the merge that scales its e4m3 product once: there the cache rows' bits
    and outputs within the weights' rounding to the activations' dtype."""
    if not uv:
        monkeypatch.setattr(decode_plan, "UV_MAX_ROWS", 0)
    merged_fp8 = []
    merge_uv = mla_absorbed.merge_uv

    def spy(part_o, part_lse, positions, w_uv, *rest):
        merged_fp8.append(isinstance(w_uv, Fp8Weight))
        return merge_uv(part_o, part_lse, positions, w_uv, *rest)

    monkeypatch.setattr(mla_absorbed, "merge_uv", spy)
    _, args = backend_case(WORK[work], 16, seed=5)
    fp8, dense = _cases(args, dtype, grid)
    got, got_cache = _run(fp8, backend)
    fused = list(merged_fp8)
    want, want_cache = _run(dense, backend)
    assert torch.equal(got_cache, want_cache)
    assert got.isfinite().all() and got.abs().max() > 0
    if backend == "triton":  # and the attention's values: the torch backend's
        assert rel_err(want, _run(dense, "torch")[0]) < (TOL if dtype == torch.float32 else 2e-2)
    # merge_uv's programs take kv_lora's 32 columns here: one scale block, or four.
    scaled = backend == "triton" and work == "decode" and uv and grid[1] % 32 == 0
    if scaled:
        tol = 1e-6 if dtype == torch.float32 else 1e-2  # half: the weights' rounding
        assert rel_err(got, want) < tol
    else:
        assert torch.equal(got, want)
    # The Triton decode step's merge read the e4m3 W_UV itself; a prefill step's decode rows
    # merge with it dequantised first.
    triton_uv = backend == "triton" and uv
    assert fused == ([work == "decode"] if triton_uv else [])


def test_fp8_weights_are_checked():
    """A block-FP8 W_UV whose data is not one matrix a head is refused with its shapes."""
    from mla_func.kernels.attention.fp8_rows import weight_args

    w = _fp8(torch.randn(SMALL["heads"], SMALL["v"], SMALL["kv_lora"]))
    flat = Fp8Weight(*quantize_matrix(dequantize(w).reshape(1, -1, SMALL["kv_lora"]), GRID),
                     GRID, w.shape)  # every head's rows in one matrix
    with pytest.raises(ValueError, match="one matrix a head"):
        weight_args(flat)
    data, (scales, s_h, s_r, rows, cols), w8 = weight_args(w)
    assert data is w.data and scales is w.scales and (rows, cols) == GRID and w8 == 2
    assert (s_h, s_r) == w.scales.stride()[:2]
    assert weight_args(_fp8(dequantize(w), GRIDS[0]))[2] == 1  # a head's rows one block
    assert weight_args(data)[2] == 0


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_fp8_model_steps_against_dequantised_absorbed_weights(dtype, monkeypatch):
    """A `quantize_fp8` model with W_UK / W_UV made block FP8 too (`quantize_fp8` leaves
    them float: `fp8_params.ABSORBED`; params built so still run) on the fused path with the
    Triton attention: a prefill step, then a decode step, against the same steps with W_UK /
    W_UV handed to the op dequantised (`kernel_ops.absorbed` on its float branch): the
    prefill's logits bit for bit, the decode's (whose merge scales its e4m3 product) within
    the weights' rounding."""
    import mla_func as mf
    from mla_func import kernel_ops
    from mla_func.fp8 import dense
    from mla_func.fp8_params import ABSORBED, map_projections
    from mla_func.kernels.plan import KernelOptions
    from mla_func.quantize import quantize_fp8

    tiny = mf.MLAConfig.preset("tiny")
    params = map_projections(  # a matrix a head, 16 x 128 blocks (V2's 128-row heads' W8 1)
        quantize_fp8(mf.init_params(tiny, seed=3, device=DEV, dtype=dtype)),
        lambda w, kind: _fp8(w, (16, 128)) if kind in ABSORBED else w)
    opts = KernelOptions(fused=True, attention="triton")
    calls = []
    fp8_absorbed = kernel_ops.absorbed

    def spy(w_uk, w_uv, dtype, opts):
        out = fp8_absorbed(w_uk, w_uv, dtype, opts)
        calls.append(out[2] is not None)
        return out

    def dense_absorbed(w_uk, w_uv, dtype, opts):
        return dense(w_uk, dtype), dense(w_uv, dtype), None, None, 0, 0

    logits = []
    for absorbed in (spy, dense_absorbed):
        monkeypatch.setattr(kernel_ops, "absorbed", absorbed)
        state = mf.init_state(tiny, num_pages=16, page_size=4, device=DEV, dtype=dtype)
        prompt = list(range(3, 12))
        pages = state.allocator.reserve(0, len(prompt) + 1)
        batch = mf.make_batch([mf.SeqWork(prompt, 0, pages)], 4, 8, DEV, kernels=opts)
        first, state = mf.forward(params, state, batch)
        batch = mf.make_batch([mf.SeqWork([9], len(prompt), pages)], 4, 8, DEV,
                              kernels=opts)
        logits.append((first, mf.forward(params, state, batch)[0]))
    assert calls and all(calls)  # every layer's op took the FP8 weights
    (first, decode), (want_first, want_decode) = logits
    assert torch.equal(first, want_first) and decode.isfinite().all()
    assert rel_err(decode, want_decode) < (1e-5 if dtype == torch.float32 else 2e-2)
