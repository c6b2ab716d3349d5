"""ptxas's resource report for kernels compiled ahead of time for sm90 (no GPU needed), and the
process the sm90 compile tests' scripts run in (test_kernels_mla_sm90, test_moe, test_router,
...): Triton compiling rather than interpreting, with this folder importable."""

import atexit
import json
import os
import re
import select
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


# The process that runs the compile scripts: started once per test process (each script in a
# fresh interpreter cost ~3 s of imports, ten of them on CI's two cores), Triton compiling in
# it (TRITON_INTERPRET=0). It reads a script a line (JSON), runs it in a namespace of its own
# and answers [exit code, stdout, stderr] a line.
_SERVER = r"""
import contextlib, io, json, sys, traceback
for line in sys.stdin:
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile(json.loads(line), "<sm90 script>", "exec"), {"__name__": "__sm90__"})
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    sys.__stdout__.write(json.dumps([code, out.getvalue(), err.getvalue()]) + "\n")
    sys.__stdout__.flush()
"""
_server: subprocess.Popen | None = None


def _compile_server() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        path = os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": path}
        _server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                   env=env, cwd=os.path.dirname(TESTS_DIR))
        atexit.register(_server.kill)
    return _server


def run_compile_script(script: str, timeout: int) -> subprocess.CompletedProcess:
    """`script` run where Triton compiles rather than interprets (a test run on CPU sets
    TRITON_INTERPRET=1 before any kernel is defined) and `sm90_ptxas` is importable: in this
    test process's compile server, in a namespace of its own; its exit code (1 where it
    raised, the traceback in stderr) and what it printed."""
    server = _compile_server()
    server.stdin.write(json.dumps(script) + "\n")
    server.stdin.flush()
    if not select.select([server.stdout], [], [], timeout)[0]:
        server.kill()
        server.wait()  # the next script starts a new server
        raise subprocess.TimeoutExpired("sm90 compile script", timeout)
    line = server.stdout.readline()
    if not line:
        return subprocess.CompletedProcess("sm90 compile script", server.wait() or 1, "",
                                           f"the compile server exited ({server.returncode})")
    code, out, err = json.loads(line)
    return subprocess.CompletedProcess("sm90 compile script", code, out, err)


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
