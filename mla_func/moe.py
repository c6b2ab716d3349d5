"""The routed-experts implementation the model calls (reference for now)."""

from mla_func.ops.moe import experts_reference as experts

__all__ = ["experts"]
