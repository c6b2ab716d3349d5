"""Experiment (GPU): the layer input's two projections as two cuBLAS GEMMs (q_proj 3072 rows,
kv_a_proj 576) against one over the stacked 3648 rows (V2-Lite), 8 layers' weights per graph
(beyond L2), per layer us."""

import torch

from scripts.bench_common import graph_time_ms, print_table

LAYERS = 8


def main() -> None:
    kw = dict(device="cuda", dtype=torch.bfloat16)
    q = [torch.randn(3072, 2048, **kw) for _ in range(LAYERS)]
    kv = [torch.randn(576, 2048, **kw) for _ in range(LAYERS)]
    qkv = [torch.cat((a, b)) for a, b in zip(q, kv, strict=True)]
    rows = []
    for m in (1, 8, 32, 128):
        x = torch.randn(m, 2048, **kw)
        two = graph_time_ms(lambda x=x: [(x @ a.T, x @ b.T) for a, b in zip(q, kv, strict=True)])
        one = graph_time_ms(lambda x=x: [(x @ w.T).split((3072, 576), 1) for w in qkv])
        rows.append({"tokens": m, "two_gemms_us": two * 1e3 / LAYERS,
                     "one_gemm_us": one * 1e3 / LAYERS, "floor_us": None})
    print_table(rows, ["tokens", "two_gemms_us", "one_gemm_us"],
                f"q_proj + kv_a_proj per layer ({torch.cuda.get_device_name()})")


if __name__ == "__main__":
    main()
