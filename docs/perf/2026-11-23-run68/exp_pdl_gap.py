"""What a programmatic dependent launch saves between two small kernels in a CUDA graph (GPU):
a chain of 64 launches of one small Triton kernel (132 programs, each reading and writing
`size` bytes of its own), per launch, µs: plain; launched with PDL and waiting at the top (its
predecessor triggers implicitly, at its end); the same with the predecessor triggering at its
start. Every launch reads the previous one's output, so each must wait.

    PYTHONPATH=. python3 exp_pdl_gap.py
"""

import torch
import triton
import triton.language as tl

from scripts.bench_common import graph_time_ms


@triton.jit
def _step(x, y, n, BLOCK: tl.constexpr, WAIT: tl.constexpr, TRIGGER: tl.constexpr):
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    if WAIT:
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    for i in range(0, n, BLOCK * tl.num_programs(0)):
        o = i + pid * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x + o, mask=o < n, other=0.0)
        tl.store(y + o, v * 0.5 + 1.0, mask=o < n)


def main() -> None:
    print(f"# {torch.cuda.get_device_name()}")
    print("| bytes a launch | plain | PDL, implicit trigger | PDL, trigger at start |")
    print("|---|---|---|---|")
    for numel in (1 << 14, 1 << 18, 1 << 21):
        a = torch.randn(numel, device="cuda")
        b = torch.empty_like(a)

        def chain(wait: bool, trigger: bool):
            def run():
                for i in range(64):
                    src, dst = (a, b) if i % 2 == 0 else (b, a)
                    _step[(132,)](src, dst, numel, BLOCK=1024, WAIT=wait, TRIGGER=trigger,
                                  num_warps=4, **({"launch_pdl": True} if wait else {}))
            return run

        ref = None
        got = {}
        for name, (w, t) in {"plain": (False, False), "implicit": (True, False),
                             "early": (True, True)}.items():
            a.copy_(torch.arange(numel, device="cuda", dtype=torch.float32) % 7)
            chain(w, t)()
            out = a.clone()
            ref = out if ref is None else ref
            assert torch.equal(out, ref), name
            got[name] = graph_time_ms(chain(w, t)) * 1e3 / 64
        print(f"| {numel * 4} | " + " | ".join(f"{v:.2f}" for v in got.values()) + " |",
              flush=True)


if __name__ == "__main__":
    main()
