"""Reference statistics for AnchorTB: hierarchical shrinkage anchors and structural buckets."""

from evosteer_core.anchors.buckets import StateKeys, StructuralBuckets, visit_ratio_excess
from evosteer_core.anchors.config import AnchorConfig
from evosteer_core.anchors.shrinkage import Anchor, RecordPrior, ShrinkagePool

__all__ = [
    "Anchor",
    "AnchorConfig",
    "RecordPrior",
    "ShrinkagePool",
    "StateKeys",
    "StructuralBuckets",
    "visit_ratio_excess",
]
