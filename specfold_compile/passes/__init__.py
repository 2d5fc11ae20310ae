"""Compiler passes, one per file, each a function ``(gm, settings) -> gm``, run in this order."""

from .analyze import Analysis, Blocker, LayerRegion, find_regions
from .fold_attention import fold_attention
from .insert_gates import insert_gates
from .lower_kernels import lower_kernels
from .pack_regions import pack_regions
from .strip_marker import strip_marker

PIPELINE = (
    ("find_regions", find_regions),
    ("insert_gates", insert_gates),
    ("pack_regions", pack_regions),
    ("fold_attention", fold_attention),
    ("lower_kernels", lower_kernels),
    ("strip_marker", strip_marker),
)

__all__ = ["PIPELINE", "Analysis", "Blocker", "LayerRegion", "find_regions", "insert_gates", "pack_regions",
           "fold_attention", "lower_kernels", "strip_marker"]
