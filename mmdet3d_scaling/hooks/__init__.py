"""hooks of mmdet3d_scaling."""
from .scaling_plan_hook import ScalingPlanHook  # noqa: F401
