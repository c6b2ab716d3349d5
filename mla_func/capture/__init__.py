"""The capture compiler: a pure step function whose tensor arguments are jaxtyping-annotated
-> dim table -> symbolic FX trace -> static segments split at the splitting ops -> buckets ->
piecewise and full CUDA graphs -> per-step dispatch.

Generic: it knows op names only through its arguments, and dim names through its `dims`
argument or, without one, the package's table (`mla_func.dims.VOCABULARY`).

    plan = plan_capture(fn, *example_args)     # no GPU; CaptureError if unsafe (dims=...)
    save_plan(plan, "graphs/NAME")             # plan.json + segment_NN.py
    step = compile_plan(plan, fn, args, bound=(0,), mode="piecewise")   # CUDA
    out = step(*args[1:])                      # FULL / PIECEWISE / eager, per call

Its modules form one line, each importing only those before it: signature (dim table) ->
trace (make_fx symbolic) -> split -> validate -> plan (plan_capture; the plan's sizes at a
bucket, the leaves of call arguments) -> capture (CUDA graphs) -> dispatch (CompiledStep) ->
compile (compile_plan, wiring capture and dispatch). artifacts (plan.json, segments) consumes
a plan and nothing in the line imports it; interop (the dim table as torch.export Dims and
dynamo marks: `export`, `mark_dynamic`) consumes a signature. buckets, errors and tree
(flattening dataclasses) are utilities any of them may import. This package face re-exports
the public names.
"""

from mla_func.capture.artifacts import save_plan
from mla_func.capture.buckets import BucketPolicy, bucket_sizes, pad_to, padding_waste
from mla_func.capture.compile import compile_plan
from mla_func.capture.dispatch import MODES, CompiledStep
from mla_func.capture.errors import (
    BindingError,
    CaptureError,
    CudaRequiredError,
    SignatureError,
)
from mla_func.capture.plan import (
    ALWAYS,
    NEVER,
    UNIFORM_BATCH,
    UNIFORM_SINGLE_TOKEN_DECODE,
    CapturePlan,
    plan_capture,
)

__all__ = [
    "ALWAYS", "MODES", "NEVER", "UNIFORM_BATCH", "UNIFORM_SINGLE_TOKEN_DECODE", "BindingError",
    "BucketPolicy", "CaptureError", "CapturePlan", "CompiledStep", "CudaRequiredError",
    "SignatureError", "bucket_sizes", "compile_plan", "pad_to", "padding_waste", "plan_capture",
    "save_plan",
]
