"""mla_func.dims: the vocabulary's bindings, and that the package's annotations keep to it."""

import pathlib
import re

import mla_func
from mla_func.config import MLAConfig
from mla_func.dims import DYNAMIC_DIMS, LOCAL_DIMS, STATIC_BINDINGS, VOCABULARY, static_sizes

PACKAGE = pathlib.Path(mla_func.__file__).parent
# A jaxtyping annotation: Float[Tensor, "tokens hidden"] and its kin (Float32, Float8e4m3fn, ...).
ANNOTATION = re.compile(
    r'\b(?:Float\w*|Int\w*|UInt\w*|Bool|Shaped|Num)\[\s*(?:torch\.)?Tensor\s*,\s*"([^"]*)"')


def annotation_dims() -> dict[str, set[str]]:
    """Every axis name of every annotation in the package: name -> files using it."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for match in ANNOTATION.finditer(path.read_text()):
            for axis in match.group(1).split():
                for name in re.split(r"[*+]", axis.lstrip("*")):
                    found.setdefault(name, set()).add(path.relative_to(PACKAGE).as_posix())
    return found


def test_annotations_use_the_vocabulary_or_a_local_name():
    """One name, one meaning: an axis is a vocabulary name, a documented local one, a number,
    or anonymous (`_`); with a leading underscore, a known name left unbound (jaxtyping checks
    no two sizes of it against each other: two weights' own block counts)."""
    found = annotation_dims()
    assert {"tokens", "hidden", "kv_lora", "width_in", "pairs"} <= set(found)  # the scan works
    unknown = {name: sorted(files) for name, files in found.items()
               if name.removeprefix("_") not in VOCABULARY
               and name.removeprefix("_") not in LOCAL_DIMS
               and not name.isdigit() and name != "_"}
    assert not unknown, f"axis names outside dims.VOCABULARY and dims.LOCAL_DIMS: {unknown}"
    assert not set(LOCAL_DIMS) & set(VOCABULARY)
    unused = set(LOCAL_DIMS) - set(found)
    assert not unused, f"LOCAL_DIMS names no annotation uses: {unused}"


def test_every_static_name_binds_and_dynamic_names_carry_a_range():
    static = {name for name, spec in VOCABULARY.items() if spec.kind == "static"}
    assert static == set(STATIC_BINDINGS)
    sizes = static_sizes(MLAConfig.preset("v2-lite"))
    assert sizes["latent"] == sizes["kv_lora"] + sizes["qk_rope"] == 576
    for name in DYNAMIC_DIMS:
        assert VOCABULARY[name].max_size and VOCABULARY[name].policy, name
