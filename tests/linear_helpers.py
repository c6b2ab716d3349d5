"""Inputs of the few-row projection kernels' tests (test_kernels_small_linear.py,
test_kernels_proj_norm.py, test_kernels_norm_linear.py): fresh random values from a seeded
generator, on the GPU when there is one; and their CUDA-graph check."""

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def projection_inputs(rows: int, n_in: int, n_out: int, dtype: torch.dtype, seed: int,
                      pad: int = 0, residual: bool = False) -> list[torch.Tensor]:
    """[x (rows x n_in, a column slice of a `pad` wider buffer when pad > 0), w (n_out x n_in,
    scaled so x w^T is O(1))], then with `residual` [h (rows x n_out), norm weight (n_out)]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in + pad, generator=g)[:, :n_in]
    w = torch.randn(n_out, n_in, generator=g) * n_in**-0.5
    out = [x, w]
    if residual:
        out += [torch.randn(rows, n_out, generator=g), 1 + 0.1 * torch.randn(n_out, generator=g)]
    return [t.to(DEV, dtype) for t in out]


def replay_matches_eager(step, src: torch.Tensor) -> None:
    """`step()` (which writes its input from `src`, then runs the kernel) captured in a CUDA
    graph; `src` redrawn, the replay's outputs equal a fresh eager call's, bit for bit."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    src.normal_()  # new inputs for the replay
    graph.replay()
    eager = step()
    captured, eager = ((captured,), (eager,)) if torch.is_tensor(eager) else (captured, eager)
    assert all(torch.equal(g, e) for g, e in zip(captured, eager, strict=True))
