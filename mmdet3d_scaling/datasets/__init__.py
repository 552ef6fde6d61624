"""datasets of mmdet3d_scaling."""
