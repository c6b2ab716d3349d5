"""The warp-specialised 64-head MLA decode (kernels/attention/decode_ws.py, Gluon, sm90) against the
torch reference on an sm90 GPU: V3's 128 heads and a partial head block (80), one split and
several, 32- and 64-key tiles, pages of 64 keys (TMA tiles) and of 1 and 16 (gathered), lengths
that are not multiples of the tile, shuffled pages, NaN in every cache row past a sequence's
end and in the workspace; and a CUDA-graph replay at new lengths against eager."""

from dataclasses import replace

import pytest
import torch
from mla_helpers import make_problem, poisoned_workspace, ref_args, rel_err

from mla_func.kernels.attention import decode_ws as ws
from mla_func.kernels.attention.absorbed import attend_absorbed
from mla_func.kernels.attention.decode import DecodeWorkspace, num_sms, plan_decode
from mla_func.ops import attention as ref

V3 = {"heads": 128, "nope": 128, "rope": 64, "v": 128, "kv_lora": 512}
CTX = [0, 31, 32, 33, 100, 1000, 2047, 3000]


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


needs_sm90 = pytest.mark.skipif(not _hopper(), reason="needs an sm90 GPU (Gluon wgmma + TMA)")


def _problem(heads, ctx, seed=0, page_size=64):
    """bf16 problem; a copy of its cache with NaN in every row past a sequence's last key
    (TMA tiles read whole pages)."""
    p = make_problem(ctx, [1] * len(ctx), page_size, dict(V3, heads=heads), device="cuda",
                     dtype=torch.bfloat16, seed=seed)
    poisoned = torch.full_like(p["cache"], float("nan"))
    table = p["page_table"].cpu()
    for i, c in enumerate(ctx):
        keys = torch.arange(c + 1)
        pages = table[i, keys // page_size].long()
        poisoned[pages, keys % page_size] = p["cache"][pages, keys % page_size]
    return p, poisoned


def _plan(p, splits, block_n, stages):
    tokens, heads = p["q_nope"].shape[:2]
    page_size = p["cache"].shape[1]
    capacity = p["page_table"].shape[1] * page_size
    base = plan_decode(tokens, capacity, num_sms(p["q_nope"].device), heads,
                       page_size=page_size)
    return replace(base, num_splits=splits, block_n=block_n, num_stages=stages, ws=True,
                   shared_p=False)


@pytest.mark.cuda
@needs_sm90
@pytest.mark.parametrize("heads", [128, 80])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("block_n,stages,page_size", [(32, 4, 64), (64, 2, 64), (32, 3, 64),
                                                      (32, 4, 1), (32, 4, 16), (64, 2, 16)])
def test_ws_matches_reference(heads, splits, block_n, stages, page_size):
    p, poisoned = _problem(heads, CTX, seed=heads + splits + block_n + stages,
                           page_size=page_size)
    assert ws.supported(poisoned, heads, block_n)
    want = ref.attend_absorbed(*ref_args(p))
    plan = _plan(p, splits, block_n, stages)
    got = attend_absorbed(*ref_args({**p, "cache": poisoned}),
                          poisoned_workspace(p, splits), plan)
    assert rel_err(got, want) < 2e-2


@pytest.mark.cuda
@needs_sm90
def test_ws_graph_replay_matches_eager():
    """Captured at one set of lengths, replayed at others (positions read on the device)."""
    p, _ = _problem(128, [4095] * 4, seed=7)
    plan = _plan(p, 2, 32, 4)
    work = DecodeWorkspace()
    out = torch.empty_like(attend_absorbed(*ref_args(p), work, plan))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attend_absorbed(*ref_args(p), work, plan, out=out)
    for lens in ([0, 5, 64, 4095], [4000, 1, 2048, 130]):
        p["positions"].copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        eager = attend_absorbed(*ref_args(p), DecodeWorkspace(), plan)
        assert torch.equal(out, eager)
        assert rel_err(out, ref.attend_absorbed(*ref_args(p))) < 2e-2


@pytest.mark.cuda
@needs_sm90
def test_ws_supported_shapes_on_sm90():
    """The shapes the backend may and may not send to the kernel on an sm90 GPU (off sm90 and
    on a CPU tensor: test_kernels_mla_ws.py's test_ws_refuses_off_sm90)."""
    gpu = torch.zeros(3, 64, 576, dtype=torch.bfloat16, device="cuda")
    assert ws.supported(gpu, 128, 32) and ws.supported(gpu, 128, 64)
    assert not ws.supported(gpu, 16, 32)  # 16 heads: the Triton kernel's tiles
    small = torch.zeros(3, 48, 576, dtype=torch.bfloat16, device="cuda")
    assert ws.supported(small, 128, 64)  # pages not a whole number of tiles: gathered
    # A view of part of each page is no paged cache: its rows are not [pages * page_size,
    # latent] (the TMA descriptor's view; flattening it would copy).
    assert not ws.supported(gpu[:, :48], 128, 32)
    assert not ws.supported(gpu, 128, 16)  # tiles of 32 or 64 keys only
    assert not ws.supported(gpu.float(), 128, 32)
