"""``Analysis``: the name under which ``backend/dispatch.py`` imports the region plan it reads."""

from .plan import RegionPlan as Analysis

__all__ = ["Analysis"]
