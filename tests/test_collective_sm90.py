"""kernels/collective: the one-launch sum + add + norm compiled ahead of time for sm90 (no GPU
needed; two GPUs run it: tests/test_parallel_cuda.py). Its barrier's PTX is built from one
template (`signals._swap_asm`): the send a release compare-and-swap 0 -> 1, the wait an acquire
1 -> 0, both at system scope, once each (the barrier before the sums: the launches alternate
between two halves of the buffer, so none is needed after)."""

from sm90_ptxas import run_compile_script

_AOT = """
import triton
from triton.backends.compiler import GPUTarget
from sm90_ptxas import ptxas_usage
from mla_func.kernels.collective.reduce_norm import _reduce_add_norm_kernel as k
const = dict(RANK=1, WORLD=2, GRID=32, BLOCK=2048)
sig = {n: "constexpr" if n in const else "*i32" if n == "phase_ptr" else
       "*bf16" if n.endswith("_ptr") else "i64" if n in ("buffers", "signal_pads") else
       "fp32" if n == "eps" else "i32"
       for n in k.arg_names}
kernel = triton.compile(triton.compiler.ASTSource(fn=k, signature=sig, constexprs=const),
                        target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
ptx = kernel.asm["ptx"]
assert ptx.count("atom.global.release.sys.cas.b32") == 1, ptx
assert ptx.count("atom.global.acquire.sys.cas.b32") == 1, ptx
assert all(", 0, 1;" in line for line in ptx.splitlines() if "release.sys.cas" in line)
assert all(", 1, 0;" in line for line in ptx.splitlines() if "acquire.sys.cas" in line)
_, spills, report = ptxas_usage(kernel)
assert spills == 0, report
"""


def test_reduce_norm_compiles_for_sm90_with_its_barriers():
    out = run_compile_script(_AOT, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
