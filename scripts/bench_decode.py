"""Decode steps and their floors: what the step, tensor-parallel and precision benchmarks
measure alike.

`step_floor` counts a decode step's bytes (each weight at its stored size: bf16, or block
FP8 with its scales; the distinct routed experts the step touched; the cache's rows) and
FLOPs against the measured ceilings; `decode_batch` makes a batch of sequences at a context;
`count_distinct_experts` runs one eager step to see which experts it touches;
`full_decode_rows` times a compiled full-graph step at every context and batch beside its
floor.
"""

import math

import torch

import mla_func as mf
from mla_func.fp8 import Fp8Weight
from mla_func.params import DenseMLP, MoE
from scripts.bench_common import StateChain, cuda_time_ms, pipelined_ms


def _numel(t: "torch.Tensor | Fp8Weight | None") -> int:
    """Elements of a weight (an FP8 weight's values, not its scales)."""
    if t is None:
        return 0
    return t.data.numel() if isinstance(t, Fp8Weight) else t.numel()


def _bytes(t: "torch.Tensor | Fp8Weight | None") -> int:
    """Bytes of a weight as stored: an FP8 weight's e4m3 values and float32 scales."""
    if t is None:
        return 0
    if isinstance(t, Fp8Weight):
        return t.data.numel() + t.scales.numel() * t.scales.element_size()
    return t.numel() * t.element_size()


def step_floor(params: mf.Params, distinct: list[int], batch: int, ctx: int,
               ceil: dict[str, float], row_bytes: int | None = None) -> dict[str, float]:
    """Bytes and FLOPs of one decode step of `batch` sequences at context `ctx`: each weight
    at its stored size (bf16, or block FP8 with its scales), the cache's rows at `row_bytes`
    a token a layer (default: the latent in the embedding's dtype)."""
    cfg = params.cfg
    weights = _bytes(params.lm_head) + _bytes(params.norm)
    flops_w = _numel(params.lm_head)
    moe_layer = 0
    for layer in params.layers:
        a = layer.attn
        attn = (a.kv_a_norm, a.w_uk, a.w_uv, a.qkv_a_proj, a.o_proj, a.q_a_norm, a.q_b_proj)
        weights += sum(_bytes(t) for t in attn) + 2 * _bytes(layer.input_norm)
        flops_w += sum(_numel(t) for t in attn)
        if isinstance(layer.mlp, DenseMLP):
            weights += _bytes(layer.mlp.gate_up) + _bytes(layer.mlp.down)
            flops_w += _numel(layer.mlp.gate_up) + _numel(layer.mlp.down)
        else:
            m: MoE = layer.mlp
            experts = m.gate_up.shape[0]  # this rank's (an FP8 weight's shape: its params')
            per_expert = (_bytes(m.gate_up) + _bytes(m.down)) // experts
            per_expert_n = (_numel(m.gate_up) + _numel(m.down)) // experts
            shared = (m.shared.gate_up, m.shared.down) if m.shared else ()
            weights += (_bytes(m.router) + sum(_bytes(t) for t in shared)
                        + distinct[moe_layer] * per_expert)
            flops_w += (_numel(m.router) + sum(_numel(t) for t in shared)
                        + cfg.num_experts_per_tok * per_expert_n)
            moe_layer += 1
    row = row_bytes or cfg.latent_dim * params.embed.element_size()
    kv_bytes = batch * (ctx + 1) * row * cfg.num_hidden_layers
    total_bytes = weights + kv_bytes
    # Absorbed attention: per head, per key: 2*(kv_lora+rope) + 2*kv_lora FLOPs.
    heads = _numel(params.layers[0].attn.w_uk) // (cfg.kv_lora_rank * cfg.qk_nope_head_dim)
    attn_flops = (batch * (ctx + 1) * heads * cfg.num_hidden_layers
                  * 2 * (cfg.latent_dim + cfg.kv_lora_rank))
    flops = 2 * batch * flops_w + attn_flops
    t_bytes = total_bytes / (ceil["copy_gbs"] * 1e9) * 1e3
    t_flops = flops / (ceil["matmul_tflops"] * 1e12) * 1e3
    floor = {"floor_ms": max(t_bytes, t_flops), "bytes_gb": total_bytes / 1e9,
             "gflop": flops / 1e9}
    if ceil.get("read_gbs"):  # the same bytes at the read-only rate: a lower floor
        floor["floor_read_ms"] = max(total_bytes / (ceil["read_gbs"] * 1e9) * 1e3, t_flops)
    return floor


def decode_batch(state: mf.KVState, batch: int, ctx: int, backend: str, seed: int,
                 max_pages: int | None = None, vocab: int = 100000,
                 kernels: "mf.KernelOptions | None" = None) -> mf.Batch:
    """`batch` sequences with `ctx` cached tokens each (pages taken from the allocator), page
    tables `max_pages` wide (a compiled step needs the width it was captured with); each
    sequence's new token is random below `vocab`."""
    alloc = state.allocator
    for seq in list(alloc.pages):
        alloc.release(seq)
    g = torch.Generator().manual_seed(seed)
    work = []
    for i in range(batch):
        pages = alloc.reserve(i, ctx + 1)
        tok = int(torch.randint(0, vocab, (1,), generator=g))
        work.append(mf.SeqWork([tok], ctx, pages))
    max_pages = max_pages or math.ceil((max(ctx, 1) + 1) / state.page_size)
    if kernels is not None:  # the options a compiled step was traced with
        return mf.make_batch(work, state.page_size, max_pages, device=state.cache.device,
                             kernels=kernels)
    return mf.make_batch(work, state.page_size, max_pages, device=state.cache.device,
                         backend=backend)


def count_distinct_experts(params, chain: StateChain, batch) -> list[int]:
    """Run one eager step (on `chain`'s state) and record how many distinct experts each MoE
    layer touched (the model calls `kernel_ops.experts_add_norm` once a MoE layer, looked up
    at call time); of sharded params, how many of this rank's experts."""
    import mla_func.kernel_ops as ops

    seen: list[int] = []
    inner = ops.experts_add_norm

    def spy(x, weights, ids, moe, *rest, **kw):
        local = moe.gate_up.shape[0]
        mine = ids - params.tp.rank * local
        seen.append(int(mine[(mine >= 0) & (mine < local)].unique().numel()))
        return inner(x, weights, ids, moe, *rest, **kw)

    ops.experts_add_norm = spy
    try:
        chain(lambda s, b: mf.forward(params, s, b), batch)
    finally:
        ops.experts_add_norm = inner
    moe_layers = sum(isinstance(layer.mlp, MoE) for layer in params.layers)
    if len(seen) != moe_layers:
        raise RuntimeError(f"saw {len(seen)} MoE calls in a step of {moe_layers} MoE layers")
    return seen


def full_decode_rows(params, chain: StateChain, step, label: str, contexts: list[int],
                     batches: list[int], max_pages: int, ceil: dict, row_bytes: int,
                     seed, kernels: "mf.KernelOptions | None" = None) -> list[dict]:
    """Compiled full-graph `step` on `chain`'s state at every context and batch, one at a
    time and back to back, beside its floor (`step_floor`, the cache at `row_bytes` a token
    a layer); `seed(batch, ctx)` draws each batch's new tokens; `kernels`: the options the
    step was traced with (else the triton backend's defaults)."""
    rows = []
    for ctx in contexts:
        for b in batches:
            batch = decode_batch(chain.state, b, ctx, "triton", seed=seed(b, ctx),
                                 max_pages=max_pages, vocab=params.cfg.vocab_size,
                                 kernels=kernels)
            distinct = count_distinct_experts(params, chain, batch)
            floor = step_floor(params, distinct, b, ctx, ceil, row_bytes=row_bytes)
            rows.append({"what": label, "ctx": ctx, "batch": b, "floor_ms": floor["floor_ms"],
                         "gb": floor["bytes_gb"],
                         "full_ms": cuda_time_ms(lambda bb=batch, f=step, c=chain: c(f, bb)),
                         "full_pipelined_ms": pipelined_ms(
                             lambda bb=batch, f=step, c=chain: c(f, bb))})
    return rows


__all__ = ["count_distinct_experts", "decode_batch", "full_decode_rows", "step_floor"]
