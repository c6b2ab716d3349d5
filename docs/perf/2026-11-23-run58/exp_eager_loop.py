"""Eager prefill steps in a loop, for a sampling profiler (py-spy, `run.sh pyspy`): V2-Lite,
random bf16 weights, Triton backend, one prompt of 1024 tokens, each step waited for."""

import time

import torch

import mla_func as mf


def main() -> None:
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    state = mf.init_state(cfg, num_pages=160, page_size=64, device="cuda",
                          dtype=torch.bfloat16)
    pages = state.allocator.reserve(0, 1024)
    toks = torch.randint(0, 100000, (1024,)).tolist()
    batch = mf.make_batch([mf.SeqWork(toks, 0, pages)], state.page_size, 128, device="cuda",
                          backend="triton")
    for _ in range(3):
        mf.forward(params, state, batch)
    torch.cuda.synchronize()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 8:
        mf.forward(params, state, batch)
        torch.cuda.synchronize()
        n += 1
    print(f"# {n} steps, {1e3 * (time.perf_counter() - t0) / n:.1f} ms a step")


if __name__ == "__main__":
    main()
