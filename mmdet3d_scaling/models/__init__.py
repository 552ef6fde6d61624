"""models of mmdet3d_scaling."""
from . import bevfusion  # noqa: F401  (registers BEVFusion and its parts)
