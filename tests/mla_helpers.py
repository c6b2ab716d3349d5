"""Shared inputs of the MLA kernel tests: small dims, random paged problems, NaN-poisoned
workspaces and the relative error (tests/test_kernels_mla*.py)."""

import torch

from mla_func.kernels.attention.decode import DecodeWorkspace

SMALL = {"heads": 4, "nope": 16, "rope": 16, "v": 16, "kv_lora": 32}
NAN = float("nan")
# Small cases run on the GPU too when there is one, where fp32 dots use tf32.
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-5 if DEV == "cpu" else 5e-3


def make_problem(ctx_lens, query_lens, page_size, dims, device=DEV, dtype=torch.float32,
                 seed=0, max_pages=None):
    """Random cache, shuffled pages, and per-token (token_seq, positions) for sequences that
    hold ctx cached tokens and bring q new ones."""
    g = torch.Generator().manual_seed(seed)
    h, latent = dims["heads"], dims["kv_lora"] + dims["rope"]
    need = [-(-(c + q) // page_size) for c, q in zip(ctx_lens, query_lens, strict=True)]
    num_pages = sum(need) + 3
    max_pages = max_pages or max(need) + 1
    cache = torch.randn(num_pages, page_size, latent, generator=g).to(device, dtype)
    order = torch.randperm(num_pages - 1, generator=g) + 1  # page 0 is scratch
    table = torch.zeros(len(need), max_pages, dtype=torch.int32)
    token_seq, positions, used = [], [], 0
    for i, (c, q) in enumerate(zip(ctx_lens, query_lens, strict=True)):
        table[i, : need[i]] = order[used: used + need[i]].to(torch.int32)
        used += need[i]
        token_seq += [i] * q
        positions += list(range(c, c + q))
    t = len(token_seq)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(device, dtype)

    return {
        "q_nope": rnd(t, h, dims["nope"]), "q_pe": rnd(t, h, dims["rope"]), "cache": cache,
        "w_uk": rnd(h, dims["nope"], dims["kv_lora"], s=dims["nope"] ** -0.5),
        "w_uv": rnd(h, dims["v"], dims["kv_lora"], s=dims["kv_lora"] ** -0.5),
        "token_seq": torch.tensor(token_seq, dtype=torch.int32, device=device),
        "positions": torch.tensor(positions, dtype=torch.int32, device=device),
        "page_table": table.to(device),
        "scale": (dims["nope"] + dims["rope"]) ** -0.5,
    }


def ref_args(p):
    return (p["q_nope"], p["q_pe"], p["cache"], p["w_uk"], p["w_uv"], p["token_seq"],
            p["positions"], p["page_table"], p["scale"])


def poison(ws, p, splits, plan=None):
    """`ws` with its buffers (and plan.shared_p's scratch, given a plan) holding NaN."""
    t, h = p["q_nope"].shape[:2]
    bufs = ws.get(p["q_nope"].device, p["cache"].dtype, t, h, p["w_uk"].shape[-1], splits)
    if plan is not None and plan.shared_p:
        bufs += ws.shared_p(p["q_nope"].device, p["cache"].dtype, t, h, plan)
    for buf in bufs:
        buf.fill_(NAN)
    return ws


def poisoned_workspace(p, splits, plan=None):
    return poison(DecodeWorkspace(), p, splits, plan)


def rel_err(got, want):
    assert torch.isfinite(got).all()
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


class TightKernel:
    """A Triton kernel stand-in for out-of-resources paths: launches whose `key` keyword is at
    least `limit` raise OutOfResources (as a shared-memory overflow would); the others run
    the real kernel. `seen` records every launch's `key`."""

    def __init__(self, real, key: str, limit: int) -> None:
        self.real, self.key, self.limit, self.seen = real, key, limit, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            from triton.runtime.errors import OutOfResources

            self.seen.append(kwargs[self.key])
            if kwargs[self.key] >= self.limit:
                raise OutOfResources(300000, 232448, "shared memory")
            return self.real[grid](*args, **kwargs)
        return launch


def count_calls(monkeypatch, owner, name: str) -> list:
    """Wrap `owner.name` (looked up at call time by its callers) so that each call appends to
    the returned list; the original still runs."""
    real, calls = getattr(owner, name), []

    def spy(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, spy)
    return calls


def mha_calls(monkeypatch) -> dict[str, list]:
    """Per attention backend, a list that grows each time it runs its MHA (long-prompt) form:
    the torch backend's `ops.attention.attend_mha`, the triton backend's `mha_prefill`."""
    from mla_func.kernels.attention import backend
    from mla_func.ops import attention

    return {"torch": count_calls(monkeypatch, attention, "attend_mha"),
            "triton": count_calls(monkeypatch, backend, "mha_prefill")}
