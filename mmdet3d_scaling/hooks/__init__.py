"""hooks of mmdet3d_scaling."""
