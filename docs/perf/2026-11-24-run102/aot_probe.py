"""Where Triton 3.6's automatic warp specialisation on sm90 applies (CPU, ahead-of-time
compile for sm90, no GPU; 2026-11-24, nineteenth session). One toy matmul loop
(`tl.range(..., warp_specialize=True)`, 128 x 256 tiles, 4 warps, 4 stages) in four forms:

  tma       A and B by TMA descriptors                         -> partitioned (12 warps)
  gather    A by pointer loads (the routed gate_up's token rows) -> the pass fails
  return    B's expert from a tile table, `if e < 0: return`     -> the pass fails
  clamp     the same expert clamped to >= 0, no return           -> partitioned

(With the tree's gate_up and down kernels given the same `tl.range` the compile passed but
nothing was partitioned, and at 4 warps they spilled ~1.7 KB: a temporary patch, reverted.)

    PYTHONPATH=<triton 3.6> TRITON_INTERPRET=0 python3 aot_probe.py
"""

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def _toy(a_desc, a_ptr, te_ptr, b_desc, c_ptr, N, K, FORM: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    e = 0
    if FORM == 2:
        e = tl.load(te_ptr + pid_m)
        if e < 0:
            return
    if FORM == 3:
        e = tl.maximum(tl.load(te_ptr + pid_m), 0)
    offs_k = tl.arange(0, 64)
    rows = tl.load(te_ptr + pid_m * 128 + tl.arange(0, 128))
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * K + offs_k[None, :]
    acc = tl.zeros((128, 256), dtype=tl.float32)
    for k in tl.range(0, K, 64, warp_specialize=True):
        if FORM == 1:
            a = tl.load(a_ptrs)
        else:
            a = a_desc.load([pid_m * 128, k])
        b = b_desc.load([e * N + pid_n * 256, k])
        acc = tl.dot(a, b.T, acc)
        a_ptrs += 64
    offs_m = pid_m * 128 + tl.arange(0, 128)
    offs_n = pid_n * 256 + tl.arange(0, 256)
    tl.store(c_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc.to(tl.bfloat16))


def main() -> None:
    sig = {"a_desc": "tensordesc<bf16[128,64]>", "a_ptr": "*bf16", "te_ptr": "*i32",
           "b_desc": "tensordesc<bf16[256,64]>", "c_ptr": "*bf16", "N": "i32", "K": "i32",
           "FORM": "constexpr"}
    for form, name in enumerate(("tma", "gather", "return", "clamp")):
        try:
            k = triton.compile(ASTSource(_toy, sig, constexprs={"FORM": form}),
                               target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": 4, "num_stages": 4})
            parts = k.asm["ttgir"].count("ttg.warp_specialize(")
            print(f"{name}: partitioned {parts}, warps {k.metadata.num_warps}, "
                  f"smem {k.metadata.shared}")
        except Exception as err:  # the pass's failure surfaces as a compile error
            print(f"{name}: compile failed ({str(err).splitlines()[0][:80]})")


if __name__ == "__main__":
    main()
