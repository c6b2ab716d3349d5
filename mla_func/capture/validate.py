"""Stage 3b, validate: every segment must be replayable as a static CUDA graph.

Rejected, with the op and the user's source line:
- host syncs and data-dependent shapes: `.item()` (`_local_scalar_dense`), `nonzero`,
  `masked_select`, `unique`, ... and any value with an unbacked symbol (`nonzero` does not fail
  the trace: it leaves an unbacked size, which we look for here);
- CPU tensors in segment compute: host-marked leaves (dataclass field metadata {"host": True})
  and, when the step runs on a device, any CPU leaf or CPU result. Host tensors that only
  splitting ops read are fine: those ops run eagerly, outside the graphs (FastDeploy's frozen
  CPU branch is exactly a host tensor read inside a captured region);
- writes outside the donated arguments and random draws, anywhere in the function
  (`purity.check_purity`).
"""

from collections import Counter

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from mla_func.capture.errors import CaptureError
from mla_func.capture.purity import check_purity
from mla_func.capture.signature import Signature
from mla_func.capture.split import Segment, op_base_name, op_name

DATA_DEPENDENT = {
    "aten::_local_scalar_dense": "a host sync (`.item()` or a Python number from a tensor)",
    "aten::item": "a host sync (`.item()`)",
    "aten::nonzero": "an output shape that depends on data",
    "aten::masked_select": "an output shape that depends on data",
    "aten::unique": "an output shape that depends on data",
    "aten::_unique": "an output shape that depends on data",
    "aten::_unique2": "an output shape that depends on data",
    "aten::unique_dim": "an output shape that depends on data",
    "aten::unique_consecutive": "an output shape that depends on data",
    "aten::repeat_interleave": "an output shape that depends on data (pass output_size)",
    "aten::bincount": "an output shape that depends on data",
    "aten::is_nonzero": "a host sync",
    "aten::equal": "a host sync",
    "aten::_assert_scalar": "a check on a data-dependent value",
    "aten::sym_constrain_range_for_size": "a data-dependent size",
}


def compute_device(sig: Signature) -> str:
    """The device most non-host leaves live on (the device the segments run on)."""
    counts = Counter(leaf.device.type for leaf in sig.leaves if not leaf.host)
    return counts.most_common(1)[0][0] if counts else "cpu"


def _where(n: fx.Node) -> str | None:
    return n.meta.get("user_frame")


def _is_cpu_array(val: object) -> bool:
    return isinstance(val, torch.Tensor) and val.device.type == "cpu" and val.dim() > 0


def validate(gm: fx.GraphModule, sig: Signature, segments: list[Segment]) -> None:
    check_purity(gm, sig)
    device = compute_device(sig)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    host_origin: dict[fx.Node, str] = {}
    for node, leaf in zip(placeholders, sig.leaves, strict=True):
        if leaf.host or (device != "cpu" and leaf.device.type == "cpu" and len(leaf.shape)):
            host_origin[node] = f"`{leaf.path}`"
    for n in gm.graph.nodes:
        if n.op == "get_attr" and device != "cpu" and _is_cpu_array(n.meta.get("val")):
            host_origin[n] = f"constant `{n.target}`"
    for seg in segments:
        for n in seg.nodes:
            _check_node(n, device, host_origin, seg.index)


def _check_node(n: fx.Node, device: str, host_origin: dict[fx.Node, str], seg: int) -> None:
    if n.op != "call_function":
        return
    base = op_base_name(n.target)
    if base in DATA_DEPENDENT:
        raise CaptureError(f"segment {seg}: {DATA_DEPENDENT[base]} cannot be in a CUDA graph",
                           op=op_name(n.target), where=_where(n))
    val = n.meta.get("val")
    if val is not None and free_unbacked_symbols(val):
        raise CaptureError(f"segment {seg}: a value whose shape or value depends on data",
                           op=op_name(n.target), where=_where(n))
    hosts = [host_origin[i] for i in n.all_input_nodes if i in host_origin]
    if hosts:
        raise CaptureError(
            f"segment {seg}: the CPU tensor {hosts[0]} is used by graph compute (its value "
            "would be frozen at capture); only splitting ops may read host tensors",
            op=op_name(n.target), where=_where(n))
    if device != "cpu" and _is_cpu_array(val):
        raise CaptureError(f"segment {seg}: a CPU result inside a {device} step "
                           "(a device-to-host copy)", op=op_name(n.target), where=_where(n))
