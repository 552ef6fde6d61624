"""datasets of mmdet3d_scaling."""
from . import transforms  # noqa: F401  (BEVFusion transforms)
from .resumable_sampler import ResumableSampler  # noqa: F401
