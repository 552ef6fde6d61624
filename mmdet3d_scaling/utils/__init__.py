"""utils of mmdet3d_scaling."""
