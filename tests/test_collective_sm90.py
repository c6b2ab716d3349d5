"""kernels/collective: the pushed sum (plain, and with the residual add and norm) compiled ahead
of time for sm90 (no GPU needed; two GPUs run it: tests/test_parallel_cuda.py). No spills; its
peers' rows are polled with volatile loads (past L1, where NVLink's stores land) and no atomic
crosses GPUs: no barrier, only the launch's own arrival counter at gpu scope."""

from sm90_ptxas import run_compile_script

_AOT = """
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from sm90_ptxas import ptxas_usage
from mla_func.kernels.collective.push_sum import _push_sum_kernel as k, launch_options
for norm, block in ((True, 2048), (False, 2048), (True, 8192), (False, 8192)):
    const = dict(RANK=1, WORLD=2, GRID=32, BLOCK=block, BITS=tl.int16, SENTINEL=-(1 << 15),
                 NORM=norm)
    sig = {n: "constexpr" if n in const else "*i32" if n == "phase_ptr" else
           "*bf16" if n.endswith("_ptr") else "i64" if n == "buffers" else
           "fp32" if n == "eps" else "i32"
           for n in k.arg_names}
    kernel = triton.compile(triton.compiler.ASTSource(fn=k, signature=sig, constexprs=const),
                            target=GPUTarget("cuda", 90, 32), options=launch_options(block))
    ptx = kernel.asm["ptx"]
    assert "ld.volatile.global" in ptx, ptx
    assert ".sys" not in ptx, [line for line in ptx.splitlines() if ".sys" in line]
    _, spills, report = ptxas_usage(kernel)
    assert spills == 0, (norm, block, report)
"""


def test_push_sum_compiles_for_sm90_without_spills_or_barriers():
    out = run_compile_script(_AOT, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
