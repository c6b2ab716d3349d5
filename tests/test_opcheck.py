"""`torch.library.opcheck` on every `mla_func::` custom op: the fake implementation gives the
real result's shapes, dtypes and strides, the schema declares what the op writes, and the op
traces under AOT dispatch with dynamic shapes (what `torch.compile` and `torch.export` rely on).

The calls checked are the ones the model makes: one prefill and one decode step of a small
config on the fused path (both attention backends), recorded under a dispatch mode, plus
direct calls of the ops the model reaches only inside another op, and the experts' ops on
block-FP8 weights (their FP8 arguments). On CPU the Triton kernels
run in the interpreter (conftest sets TRITON_INTERPRET); on a GPU the same test checks them
there. No op needs a GPU to be checked. What an op writes and leaves as it was (the arrival
counters) no run shows: the schemas are checked by argument name for that.
"""

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mla_func as mf
from mla_func.fp8 import FP8, quantize
from mla_func.fp8_params import ABSORBED, map_projections
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.linear import fp8_dequant, fp8_linear, small_linear
from mla_func.kernels.plan import KernelOptions
from mla_func.moe import moe_experts_add_norm_op, moe_experts_op
from mla_func.parallel.comm import _all_reduce, _all_reduce_add_norm
from mla_func.quantize import quantize_fp8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMESPACE = "mla_func::"


class _Record(TorchDispatchMode):
    """Every `mla_func` op call seen, its arguments cloned before it ran (the first call of
    each op and attention form)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, tuple] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name.startswith(NAMESPACE):
            key = name
            if "attention" in name:  # its backend, rows, and W_UK / W_UV in block FP8 (W_UK's
                fp8 = args[12] is not None  # scales: `attention.op_args`' 13th)
                key += f" {args[-1]} {args[0].shape[0]}" + (" fp8" if fp8 else "")
            clone = torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))
            self.calls.setdefault(key, (func, *clone))  # (op, args, kwargs)
        return func(*args, **(kwargs or {}))


def _model_calls(backend: str, fp8: bool = False) -> dict[str, tuple]:
    """The custom-op calls of two steps of a small q_lora config (q_lora adds a norm of the
    query) on the fused path with `backend`: two prompts in the MHA form, then their two
    decodes in the absorbed one (more than one row: its result's layout shows); `fp8`: its
    weights in block FP8 (`quantize_fp8`), W_UK / W_UV too (which it leaves float:
    `fp8_params.ABSORBED`; a matrix a head)."""
    cfg = dataclasses.replace(mf.MLAConfig.preset("tiny"), q_lora_rank=24,
                              num_hidden_layers=2)
    params = mf.init_params(cfg, seed=1, device=DEVICE)
    if fp8:
        params = map_projections(quantize_fp8(params), lambda w, kind: quantize(
            w, 128, stack=1) if kind in ABSORBED else w)
    state = mf.init_state(cfg, num_pages=8, page_size=4, device=DEVICE)
    opts = KernelOptions(attention=backend, fused=True, experts="triton")
    a, b = state.allocator.reserve(0, 6), state.allocator.reserve(1, 4)
    prefill = mf.make_batch([mf.SeqWork([3, 4, 5, 6, 7], 0, a), mf.SeqWork([9, 8, 7], 0, b)],
                            4, 2, DEVICE,
                            kernels=dataclasses.replace(opts, mha_min_query=2))
    decode = mf.make_batch([mf.SeqWork([8], 5, a), mf.SeqWork([6], 3, b)], 4, 2, DEVICE,
                           kernels=opts)
    with torch.no_grad(), _Record() as rec:
        _, state = mf.forward(params, state, prefill)
        mf.forward(params, state, decode)
    return rec.calls


def _direct_calls() -> dict[str, tuple]:
    """Ops the model calls only from inside another op's function (or not at all)."""
    g = torch.Generator().manual_seed(2)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(DEVICE)

    tokens, topk, n_exp, hidden, inter = 3, 2, 4, 32, 16
    ids = torch.stack([torch.randperm(n_exp, generator=g)[:topk] for _ in range(tokens)])
    counters = Runtime(torch.device(DEVICE)).counters
    experts = (r(tokens, hidden), r(tokens, topk).abs(), ids.to(DEVICE),
               r(n_exp, 2, inter, hidden), r(n_exp, hidden, inter), r(2, inter, hidden),
               r(hidden, inter), counters, True)
    # Block-FP8 projections (the model reaches them with FP8 params): many rows (activations
    # quantised apart), and one row of a first projection (the norm from h).
    w = quantize(r(24, 160).cpu(), 128).to(DEVICE)
    fp8 = (w.data, w.scales, *w.block)
    return {"mla_func::small_linear": (small_linear.small_linear.op, (r(2, 40), r(24, 40)), {}),
            "mla_func::fp8_linear": (fp8_linear.fp8_linear_op.op,
                                     (r(20, 160).bfloat16(), *fp8, counters), {}),
            "mla_func::fp8_dequantize": (fp8_dequant.fp8_dequantize_op.op,
                                         (*fp8, torch.bfloat16), {}),
            "mla_func::fp8_norm_linear": (fp8_linear.fp8_norm_linear_op.op,
                                          (r(1, 160), r(1, 160), r(160), 1e-6, *fp8, counters),
                                          {}),
            "mla_func::moe_experts": (moe_experts_op.op, experts, {}),
            **_fp8_experts_calls(r, ids.to(DEVICE), counters),
            # The sum over ranks, in a group of one (NCCL's form; the one-shot form needs two
            # GPUs: tests/test_parallel_cuda.py).
            "mla_func::all_reduce": (_all_reduce.op, (r(3, 40), counters, _one_rank_group(),
                                                      False), {}),
            # ... and a sub-layer's end: the sum, the residual add and the norm (the fused
            # kernel's one launch: 2 GPUs, tests/test_parallel_cuda.py).
            "mla_func::all_reduce_add_norm": (
                _all_reduce_add_norm.op, (r(3, 40), r(3, 40), r(40), 1e-6, counters,
                                          _one_rank_group(), False, False, True), {})}


def _fp8_experts_calls(r, ids: torch.Tensor, counters: torch.Tensor) -> dict[str, tuple]:
    """Both experts ops on block-FP8 weights (their e4m3 data and scales, as `mla_func.moe`
    passes them): routed alone, and with the residual add, the norm and a shared expert (apart:
    moe_inter is no whole scale group)."""
    tokens, topk = ids.shape
    hidden, inter, n_exp = 32, 16, 4
    gu = quantize(r(n_exp, 2, inter, hidden), 128, 2, 1)
    dn = quantize(r(n_exp, hidden, inter), 128, 1)
    sgu, sdn = quantize(r(2, inter, hidden), 128, 1), quantize(r(hidden, inter), 128)
    x, weights = r(tokens, hidden), r(tokens, topk).abs()
    routed = (gu.data.view(gu.shape), dn.data.view(dn.shape))
    scales = dict(gate_up_scales=gu.scales.view(n_exp, 2, *gu.scales.shape[1:]),
                  down_scales=dn.scales)
    shared = dict(shared_gate_up_scales=sgu.scales, shared_down_scales=sdn.scales[0])
    add_norm = (r(tokens, hidden), 1 + r(hidden) / 10, 1e-6, False)
    return {"mla_func::moe_experts fp8": (
                moe_experts_op.op, (x, weights, ids, *routed, None, None, counters, True),
                dict(scales, block_rows=[128] * 2)),
            "mla_func::moe_experts_add_norm fp8": (
                moe_experts_add_norm_op.op, (x, weights, ids, *routed, sgu.data.view(sgu.shape),
                                             sdn.data.view(sdn.shape), *add_norm, counters,
                                             True), dict(scales, **shared, block_rows=[128] * 4))}


def _one_rank_group() -> str:
    """The name of a gloo group of this process alone (made once)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist.group.WORLD.group_name


def _registered() -> set[str]:
    """Every op registered under the namespace (the modules that define them imported)."""
    import mla_func.kernels.router.route  # noqa: F401
    import mla_func.moe  # noqa: F401

    return {n.split(".")[0] for n in torch._C._dispatch_get_all_op_names()
            if n.startswith(NAMESPACE)}


@pytest.fixture(scope="module")
def calls() -> dict[str, tuple]:
    found = {**_model_calls("torch"), **_direct_calls()}
    backends = ["torch"]
    if DEVICE == "cuda" or _triton_attention_runs_here():
        found.update({k: v for k, v in _model_calls("triton").items() if "attention" in k})
        backends.append("triton")
    for backend in backends:  # the attention op with block-FP8 W_UK / W_UV
        found.update({k: v for k, v in _model_calls(backend, fp8=True).items()
                      if "attention" in k})
    return found


def _schema(op) -> torch.FunctionSchema:
    """The op's schema: a recorded call's overload has it, a `custom_op` holds its text."""
    if isinstance(op._schema, torch.FunctionSchema):
        return op._schema
    return torch._C.parse_schema(op._name + op._schema)


def _triton_attention_runs_here() -> bool:
    from mla_func.attention import triton_unavailable

    return triton_unavailable(torch.device(DEVICE)) is None


def test_every_op_is_checked(calls):
    seen = {k.split(" ")[0] for k in calls}
    assert seen == _registered(), sorted(_registered() ^ seen)
    forms = {tuple(k.split(" ")[1:]) for k in calls if "attention" in k}
    backends = ["torch"]
    if DEVICE == "cuda" or _triton_attention_runs_here():
        backends.append("triton")
    # the prefill and the decode call, with float and block-FP8 W_UK / W_UV
    want = {(b, rows, *fp8) for b in backends for rows in ("8", "2") for fp8 in ((), ("fp8",))}
    assert forms == want, forms


def test_opcheck(calls, monkeypatch):
    """One test, not one per op: the recording runs the model once. opcheck runs each op on
    copies of its arguments: a copy of a state's cache belongs to no state, and borrows the
    runtime of one here (the Triton attention keeps its workspace there)."""
    of, spare = Runtime.of, Runtime(torch.device(DEVICE))

    def of_or_spare(t: torch.Tensor) -> Runtime:
        try:
            return of(t)
        except RuntimeError:
            return spare

    monkeypatch.setattr(Runtime, "of", staticmethod(of_or_spare))
    failed = {}
    for key, (op, args, kwargs) in sorted(calls.items()):
        utils = {}
        if any(isinstance(a, torch.Tensor) and a.dtype == FP8 for a in args):
            # test_schema compares each argument before and after with torch.allclose, which
            # has no float8 kernel: compare their bytes here instead, and run the rest.
            utils = dict(test_utils=("test_autograd_registration", "test_faketensor",
                                     "test_aot_dispatch_dynamic"))
            # (Only the arguments the schema does not write: the attention's cache changes.)
            written = {i for i, a in enumerate(_schema(op).arguments)
                       if a.alias_info is not None and a.alias_info.is_write}
            kept = [i for i, a in enumerate(args)
                    if isinstance(a, torch.Tensor) and i not in written]
            before = [args[i].clone() for i in kept]
            op(*args, **kwargs)
            assert all(_same_bytes(args[i], b) for i, b in zip(kept, before, strict=True)), key
        result = torch.library.opcheck(op, args, kwargs, raise_exception=False, **utils)
        bad = {test: str(r) for test, r in result.items() if r != "SUCCESS"}
        if bad:
            failed[key] = bad
    assert not failed, failed


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_ops_declare_the_state_they_write():
    """opcheck sees only net changes; the arrival counters are zero again after every launch.
    So by name: an op handed a state tensor (the cache, the counters) declares it written."""
    for name in sorted(_registered()):
        ns, op = name.split("::")
        schema = getattr(getattr(torch.ops, ns), op).default._schema
        for a in schema.arguments:
            if a.name in ("cache", "counters"):
                assert a.alias_info is not None and a.alias_info.is_write, (name, a.name)
