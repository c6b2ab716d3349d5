"""Throwaway experiment (not committed): per-program rate of MLA decode tile loops."""
import sys

import torch
import triton
import triton.language as tl
import triton.testing


@triton.jit
def _k(q_lat, q_pe, cache, page_table, lens, out, s_pt, chunk_keys,
       page_size: tl.constexpr, MODE: tl.constexpr, BLOCK_N: tl.constexpr):
    H: tl.constexpr = 16
    C: tl.constexpr = 512
    R: tl.constexpr = 64
    L: tl.constexpr = 576
    split = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    kv_len = tl.load(lens + t)
    start = split * chunk_keys
    end = tl.minimum(start + chunk_keys, kv_len)
    h = tl.arange(0, H)
    c = tl.arange(0, C)
    r = tl.arange(0, R)
    q = tl.load(q_lat + t * H * C + h[:, None] * C + c[None, :])
    qp = tl.load(q_pe + t * H * R + h[:, None] * R + r[None, :])
    m = tl.full([H], float("-inf"), tl.float32)
    lsum = tl.zeros([H], tl.float32)
    acc = tl.zeros([H, C], tl.float32)
    nn = tl.arange(0, BLOCK_N)
    pt = page_table + t * s_pt
    page_next = tl.load(pt + start // page_size)
    row_next = page_next.to(tl.int64) * page_size + start % page_size
    kv_next = tl.load(cache + (row_next + nn)[:, None] * L + c[None, :])
    kp_next = tl.load(cache + (row_next + nn)[:, None] * L + C + r[None, :])
    for n0 in range(start, end, BLOCK_N):
        n = n0 + nn
        nm = n < end
        if MODE == 0:  # per-key page gather
            page = tl.load(pt + n // page_size, mask=nm, other=0)
            row = page.to(tl.int64) * page_size + n % page_size
            kv = tl.load(cache + row[:, None] * L + c[None, :], mask=nm[:, None], other=0.0)
            kp = tl.load(cache + row[:, None] * L + C + r[None, :], mask=nm[:, None], other=0.0)
        elif MODE == 1:  # one page id per tile
            page = tl.load(pt + n0 // page_size)
            row = page.to(tl.int64) * page_size + n0 % page_size + nn
            kv = tl.load(cache + row[:, None] * L + c[None, :], mask=nm[:, None], other=0.0)
            kp = tl.load(cache + row[:, None] * L + C + r[None, :], mask=nm[:, None], other=0.0)
        elif MODE == 2:  # page id of the next tile loaded one iteration ahead
            row = row_next + nn
            nxt = n0 + BLOCK_N
            page_next = tl.load(pt + nxt // page_size, mask=nxt < end, other=0)
            row_next = page_next.to(tl.int64) * page_size + nxt % page_size
            kv = tl.load(cache + row[:, None] * L + c[None, :], mask=nm[:, None], other=0.0)
            kp = tl.load(cache + row[:, None] * L + C + r[None, :], mask=nm[:, None], other=0.0)
        else:  # the next tile itself loaded one iteration ahead (register double buffer)
            kv = kv_next
            kp = kp_next
            nxt = n0 + BLOCK_N
            page_next = tl.load(pt + nxt // page_size, mask=nxt < end, other=0)
            rn = page_next.to(tl.int64) * page_size + nxt % page_size + nn
            more = (nxt + nn) < end
            kv_next = tl.load(cache + rn[:, None] * L + c[None, :], mask=more[:, None],
                              other=0.0)
            kp_next = tl.load(cache + rn[:, None] * L + C + r[None, :],
                              mask=more[:, None], other=0.0)
        s = tl.dot(q, tl.trans(kv)) + tl.dot(qp, tl.trans(kp))
        s = tl.where(nm[None, :], s * 0.1, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv)
        m = m_new
    o = acc / lsum[:, None]
    tl.store(out + ((t * tl.num_programs(0) + split) * H + h[:, None]) * C + c[None, :], o)


def main():
    torch.manual_seed(0)
    dev = "cuda"
    page = 64
    print(torch.cuda.get_device_name(), triton.__version__)
    for batch, ctx, splits in ((1, 1024, 1), (1, 1024, 8), (128, 4096, 1), (128, 4096, 2),
                               (32, 4096, 8), (128, 1024, 2)):
        pages_per = ctx // page
        n_pages = batch * pages_per + 1
        cache = torch.randn(n_pages * page, 576, device=dev, dtype=torch.bfloat16)
        table = (torch.randperm(n_pages - 1, device=dev)[: batch * pages_per] + 1).view(
            batch, pages_per).int()
        lens = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
        q = torch.randn(batch, 16, 512, device=dev, dtype=torch.bfloat16)
        qp = torch.randn(batch, 16, 64, device=dev, dtype=torch.bfloat16)
        out = torch.empty(batch * splits * 16 * 512, device=dev, dtype=torch.float32)
        chunk = ctx // splits
        byts = batch * ctx * 576 * 2
        res = []
        for mode in (0, 1, 2, 3):
            for bn in (32, 64):
                for warps in (4, 8):
                    for stages in (1, 2, 3):
                        def fn():
                            _k[(splits, batch)](q, qp, cache, table, lens, out, table.stride(0),
                                                chunk, page_size=page, MODE=mode, BLOCK_N=bn,
                                                num_warps=warps, num_stages=stages)
                        try:
                            fn()
                            us = triton.testing.do_bench(fn, return_mode="median") * 1e3
                        except Exception as err:  # noqa: BLE001
                            print(f"  mode {mode} n{bn} w{warps} s{stages}: {type(err).__name__} {str(err)[-300:]}")
                            continue
                        res.append((us, mode, bn, warps, stages))
        res.sort()
        best = {m: min(r for r in res if r[1] == m) for m in (0, 1, 2, 3) if any(r[1] == m for r in res)}
        print(f"B={batch} ctx={ctx} splits={splits}: " + "  ".join(
            f"mode{m} {b[0]:.1f}us n{b[2]}w{b[3]}s{b[4]} ({byts / b[0] / 1e3:.0f} GB/s)"
            for m, b in best.items()))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
