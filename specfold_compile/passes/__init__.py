"""Compiler passes, one per file: ``find_regions(gm, settings) -> RegionPlan``, then each rewrite
``(gm, plan, settings) -> (gm, plan)``, run in this order (the contract: ``passes/plan.py``)."""

from .find_regions import find_regions
from .fold_attention import fold_attention
from .insert_gates import insert_gates
from .lower_kernels import lower_kernels
from .pack_regions import pack_regions
from .plan import Blocker, HeadRegion, LayerRegion, RegionPlan, RowPlan
from .strip_marker import strip_marker

REWRITES = (
    ("insert_gates", insert_gates),
    ("pack_regions", pack_regions),
    ("fold_attention", fold_attention),
    ("lower_kernels", lower_kernels),
    ("strip_marker", strip_marker),
)
PIPELINE = (("find_regions", find_regions),) + REWRITES

__all__ = ["PIPELINE", "REWRITES", "RegionPlan", "Blocker", "LayerRegion", "HeadRegion", "RowPlan", "find_regions",
           "insert_gates", "pack_regions", "fold_attention", "lower_kernels", "strip_marker"]
