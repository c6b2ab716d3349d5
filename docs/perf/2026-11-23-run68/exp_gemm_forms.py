"""The decode step's skinny cuBLAS GEMMs in other forms (GPU): per GEMM, µs, in one CUDA graph
over 8 weight copies (120+ MB: the weights come from DRAM, as in the step):
  linear:    F.linear(x, W) (the model's `x @ W.T`);
  lt:        the same with torch.backends.cuda.preferred_blas_library("cublaslt");
  swapped:   (W @ x.T).T, a transposed view (cuBLAS sees M = N_out, N = tokens);
  swapped_c: the same made contiguous (the copy the model would need).
Shapes: the stacked q + kv_a projection [3648, 2048], o_proj [2048, 2048]; 1, 32, 128 rows.
Run it with TORCH_CUBLASLT_WORKSPACE_SIZE set to compare workspaces.

    PYTHONPATH=. python3 exp_gemm_forms.py
"""

import os

import torch
import torch.nn.functional as F

from scripts.bench_common import graph_time_ms


def main() -> None:
    print(f"# {torch.cuda.get_device_name()}, TORCH_CUBLASLT_WORKSPACE_SIZE="
          f"{os.environ.get('TORCH_CUBLASLT_WORKSPACE_SIZE')}, CUBLAS_WORKSPACE_CONFIG="
          f"{os.environ.get('CUBLAS_WORKSPACE_CONFIG')}")
    print("| weight | M | linear | lt | swapped | swapped_c |")
    print("|---|---|---|---|---|---|")
    for name, (n, k) in {"q+kv_a": (3648, 2048), "o_proj": (2048, 2048)}.items():
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(8)]
        for m in (1, 32, 128):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, ws[0]).float()
            forms = {
                "linear": lambda w: F.linear(x, w),
                "lt": lambda w: F.linear(x, w),
                "swapped": lambda w: (w @ x.T).T,
                "swapped_c": lambda w: (w @ x.T).T.contiguous(),
            }
            got = {}
            for form, fn in forms.items():
                lib = torch.backends.cuda.preferred_blas_library()
                if form == "lt":
                    torch.backends.cuda.preferred_blas_library("cublaslt")
                try:
                    err = (fn(ws[0]).float() - ref).abs().max().item()
                    assert err < 1e-2, (form, err)
                    got[form] = graph_time_ms(lambda f=fn: [f(w) for w in ws]) * 1e3 / len(ws)
                finally:
                    torch.backends.cuda.preferred_blas_library(lib)
            print(f"| {name} | {m} | " + " | ".join(f"{got[f]:.2f}" for f in forms) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
