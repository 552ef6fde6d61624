"""models of mmdet3d_scaling."""
