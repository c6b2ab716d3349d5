"""The dtypes the API takes, by `torch.dtype` or by name: one table for the package and its
scripts (`--dtype`), so that `init_params(dtype="bf16")` and `load_hf(dtype="bfloat16")` mean
what `torch.bfloat16` means."""

import torch

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
}


def resolve_dtype(value: "torch.dtype | str", what: str = "dtype") -> torch.dtype:
    """`value` as a floating-point `torch.dtype`; a ValueError naming the accepted names
    otherwise."""
    if isinstance(value, str):
        dtype = DTYPES.get(value.lower().removeprefix("torch."))
        if dtype is None:
            raise ValueError(f"{what} {value!r} is not a dtype name; use one of "
                             f"{', '.join(DTYPES)} or a torch.dtype")
        return dtype
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"{what} must be a floating-point dtype (a torch.dtype or one of "
                         f"{', '.join(DTYPES)}); got {value}")
    return value
