"""mla_func: pure-functional DeepSeek MLA inference with typed signatures and explicit state.

This module is the package's face and owns nothing else: it re-exports the public API
(MLAConfig, init_params, load_hf, forward, generate; plus the state and batch types the step
function takes, the error of a consumed state, and the engine's names). Package modules import
the concrete modules, never this face, so it may import any of them.
"""

from mla_func.batch import Batch, BatchError, KernelOptions, SeqWork, make_batch
from mla_func.config import ConfigError, MLAConfig
from mla_func.donation import ConsumedError
from mla_func.model import forward
from mla_func.parallel.group import TensorParallel
from mla_func.parallel.shard import shard_params
from mla_func.params import Params, init_params
from mla_func.state import CacheFullError, KVState, PageAllocator, init_state

_ENGINE_NAMES = ("Engine", "RequestError", "TokenIdError", "EmptyPromptError",
                 "PromptTooLongError")
_GENERATION_NAMES = ("generate", "GenerateOutput")


def __getattr__(name: str):
    # Lazy: checkpoint loading and the engine pull in optional packages.
    if name == "load_hf":
        from mla_func.checkpoint import load_hf

        return load_hf
    if name in _ENGINE_NAMES:
        from mla_func import engine

        return getattr(engine, name)
    if name in _GENERATION_NAMES:
        from mla_func import generation

        return getattr(generation, name)
    raise AttributeError(f"module 'mla_func' has no attribute {name!r}")


__all__ = [
    "Batch", "BatchError", "CacheFullError", "ConfigError", "ConsumedError", "EmptyPromptError",
    "Engine",
    "GenerateOutput", "KVState", "KernelOptions", "MLAConfig", "PageAllocator", "Params",
    "PromptTooLongError", "RequestError", "SeqWork", "TensorParallel", "TokenIdError", "forward",
    "generate", "init_params", "init_state", "load_hf", "make_batch", "shard_params",
]
