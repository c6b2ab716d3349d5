"""ptxas's resource report for kernels compiled ahead of time for sm90 (no GPU needed), and the
subprocess the sm90 compile tests run in (test_kernels_mla_sm90, test_moe, test_router): Triton
compiling rather than interpreting, with this folder importable."""

import os
import re
import subprocess
import sys
import tempfile

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def ptxas_usage(kernel) -> tuple[int, int, str]:
    """(registers, spill-store bytes, ptxas's report) of a `triton.compile` result."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "kernel.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        out = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", ptx, "-o",
                              ptx + ".cubin"], capture_output=True, text=True)
    regs = int(re.search(r"Used (\d+) registers", out.stderr).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", out.stderr).group(1))
    return regs, spills, out.stderr


def run_compile_script(script: str, timeout: int) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter with TRITON_INTERPRET=0 (a test run on CPU sets it to 1
    before any kernel is defined) and `sm90_ptxas` importable."""
    path = os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=os.path.dirname(TESTS_DIR))


def compile_sm90(fn, const: dict, types: dict, descs: dict, warps: int, stages: int
                 ) -> tuple[int, str]:
    """(spill-store bytes, ptxas's report) of Triton kernel `fn` compiled for sm90 with
    constexprs `const` (the kernel's defaults for the constexprs it leaves out, as a launch
    takes them), as a launch at V2-Lite sizes specialises it: `types` and `descs` name
    arguments' types (the rest: `*_ptr` bf16 pointers, else i32), pointers, strides and dims
    16-aligned."""
    import triton
    from triton.backends.compiler import GPUTarget

    const = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default},
             **const}

    sig = {n: "constexpr" if n in const else descs[n] if n in descs else types[n]
           if n in types else "*bf16" if n.endswith("_ptr") else "i32" for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n][0] == "*" or n.startswith(("stride", "n_inter", "n_hidden"))}
    kernel = triton.compile(
        triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
        target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    _, spills, report = ptxas_usage(kernel)
    return spills, report
