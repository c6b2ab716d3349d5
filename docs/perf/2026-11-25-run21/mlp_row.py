"""Prototype (thirtieth session): the MoE at one token as one streaming kernel + a reduction.

Program (p, s) takes pair slot p (routed p < topk, then the shared experts) and slice s of
moe_inter: act = silu(x W_gate[s]^T) * (x W_up[s]^T) (rounded to the model dtype, as the
tree's gate_up stores it), then its split-K share of the down product, act W_down[:, s]^T,
stored in fp32 to part[p, s, :]. The down weights stream right after the gate_up ones in the
same program: no kernel boundary between the two GEMMs. `reduce_kernel` then sums the slices
of each pair (fp32), rounds and weights them as `moe_down._weighted` and `_store_pairs` do,
sums the pairs, adds the residual (`moe_sum._add_residual`'s rounding), without the norm (the
B=1 step leaves it to `norm_linear`).
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl

from mla_func.kernels.moe_gemm import expert_base


@triton.jit
@no_type_check
def mlp_row_kernel(
    x_ptr, ids_ptr, gu_ptr, sgu_ptr, dn_ptr, sdn_ptr, part_ptr, topk, n_routed, n_inter,
    n_hidden, n_slices, s_gu_e, s_gu_g, s_gu_n, s_sgu_e, s_sgu_g, s_sgu_n, s_dn_e, s_dn_n,
    s_sdn_e, s_sdn_n,
    BI: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr, ROWS: tl.constexpr,
    PRECISION: tl.constexpr, PDL: tl.constexpr, TRIGGER: tl.constexpr,
):
    p = tl.program_id(0)
    s = tl.program_id(1)
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    routed = p < topk
    if PDL:  # the router wrote ids; the shared slots need none of it
        if routed:
            tl.extra.cuda.gdc_wait()
    e = tl.load(ids_ptr + p, mask=routed, other=0).to(tl.int32)
    e = tl.where(routed, e, n_routed + p - topk)
    shared = e >= n_routed
    base = expert_base(gu_ptr, sgu_ptr, e, n_routed, s_gu_e, s_sgu_e)
    stride_g = tl.where(shared, s_sgu_g, s_gu_g)
    stride_n = tl.where(shared, s_sgu_n, s_gu_n)
    offs_i = s * BI + tl.arange(0, BI)
    i_ok = offs_i < n_inter
    offs_k = tl.arange(0, BK)
    rows = tl.arange(0, ROWS)
    row0 = rows == 0
    a_ptrs = x_ptr + rows[:, None] * 0 + offs_k[None, :]
    g_ptrs = base + offs_i[None, :].to(tl.int64) * stride_n + offs_k[:, None]
    u_ptrs = g_ptrs + stride_g
    acc_g = tl.zeros((ROWS, BI), dtype=tl.float32)
    acc_u = tl.zeros((ROWS, BI), dtype=tl.float32)
    for k in range(0, n_hidden, BK):
        k_ok = offs_k + k < n_hidden
        a = tl.load(a_ptrs, mask=row0[:, None] & k_ok[None, :], other=0.0)
        g = tl.load(g_ptrs, mask=k_ok[:, None] & i_ok[None, :], other=0.0)
        u = tl.load(u_ptrs, mask=k_ok[:, None] & i_ok[None, :], other=0.0)
        acc_g = tl.dot(a, g, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, u, acc_u, input_precision=PRECISION)
        a_ptrs += BK
        g_ptrs += BK
        u_ptrs += BK
    dtype = x_ptr.dtype.element_ty
    act = (acc_g * tl.sigmoid(acc_g) * acc_u).to(dtype)  # as the tree's `act` holds it
    dbase = expert_base(dn_ptr, sdn_ptr, e, n_routed, s_dn_e, s_sdn_e)
    stride_d = tl.where(shared, s_sdn_n, s_dn_n)
    offs_n = tl.arange(0, BN)
    d_ptrs = dbase + offs_n[None, :].to(tl.int64) * stride_d + offs_i[:, None]
    if PDL:  # `part` may be memory the router's launch still used
        tl.extra.cuda.gdc_wait()
    out = part_ptr + (p * n_slices + s).to(tl.int64) * n_hidden
    for n0 in range(0, n_hidden, BN):
        n_ok = offs_n + n0 < n_hidden
        d = tl.load(d_ptrs, mask=i_ok[:, None] & n_ok[None, :], other=0.0)
        y = tl.dot(act, d, input_precision=PRECISION)
        y0 = tl.sum(tl.where(row0[:, None], y, 0.0), axis=0)
        tl.store(out + n0 + offs_n, y0, mask=n_ok)
        d_ptrs += BN * stride_d


@triton.jit
@no_type_check
def reduce_kernel(
    part_ptr, w_ptr, res_ptr, out_ptr, n_slices, n_hidden,
    TOPK: tl.constexpr, PAIRS: tl.constexpr, S_P2: tl.constexpr, BR: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    c = tl.program_id(0) * BR + tl.arange(0, BR)
    c_ok = c < n_hidden
    sl = tl.arange(0, S_P2)
    s_ok = sl < n_slices
    dt = out_ptr.dtype.element_ty
    acc = tl.zeros((BR,), dtype=tl.float32)
    for p in tl.static_range(PAIRS):
        at = part_ptr + (p * n_slices + sl[:, None]).to(tl.int64) * n_hidden + c[None, :]
        tile = tl.load(at, mask=s_ok[:, None] & c_ok[None, :], other=0.0, cache_modifier=".cg")
        y = tl.sum(tile, axis=0).to(dt).to(tl.float32)
        if p < TOPK:
            y = y * tl.load(w_ptr + p)
        acc += y.to(dt).to(tl.float32)
    r = tl.load(res_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + c, (r + acc.to(dt).to(tl.float32)).to(dt), mask=c_ok)


def mlp_row(x, weights, ids, gate_up, down, s_gate_up, s_down, residual, bi=32, bk=128,
            bn=128, warps=4, stages=3, br=16, pdl=False, trigger=False):
    """residual + the MoE of x's one row (s_gate_up / s_down: `shared_as_experts` views)."""
    topk = ids.shape[1]
    n_routed, _, n_inter, n_hidden = gate_up.shape
    pairs = topk + s_gate_up.shape[0]
    bi = min(bi, max(16, triton.next_power_of_2(n_inter)))
    bk = min(bk, max(16, triton.next_power_of_2(n_hidden)))
    bn = min(bn, max(16, triton.next_power_of_2(n_hidden)))
    n_slices = triton.cdiv(n_inter, bi)
    part = torch.empty(pairs, n_slices, n_hidden, dtype=torch.float32, device=x.device)
    prec = "ieee" if x.dtype == torch.float32 else "tf32"
    mlp_row_kernel[(pairs, n_slices)](
        x, ids, gate_up, s_gate_up, down, s_down, part, topk, n_routed, n_inter, n_hidden,
        n_slices, gate_up.stride(0), gate_up.stride(1), gate_up.stride(2),
        s_gate_up.stride(0), s_gate_up.stride(1), s_gate_up.stride(2),
        down.stride(0), down.stride(1), s_down.stride(0), s_down.stride(1),
        BI=bi, BK=bk, BN=bn, ROWS=16, PRECISION=prec, PDL=pdl, TRIGGER=trigger,
        num_warps=warps, num_stages=stages, **({"launch_pdl": True} if pdl else {}))
    out = torch.empty_like(residual)
    reduce_kernel[(triton.cdiv(n_hidden, br),)](
        part, weights, residual, out, n_slices, n_hidden, TOPK=topk, PAIRS=pairs,
        S_P2=triton.next_power_of_2(n_slices), BR=br, PDL=pdl, num_warps=4,
        **({"launch_pdl": True} if pdl else {}))
    return out
