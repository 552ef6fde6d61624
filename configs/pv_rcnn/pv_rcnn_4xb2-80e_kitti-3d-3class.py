# Alias: the former name of configs/pv_rcnn/pv_rcnn_4xb2-acc2-80e_kitti-3d-3class.py
# (renamed to mmdet3d's rule {algorithm}_{components}_{N}xb{B}[-amp][-accK]-{schedule}_{dataset},
# docs/configs.md). Kept so commands and work dirs that use this name still work.
_base_ = ['./pv_rcnn_4xb2-acc2-80e_kitti-3d-3class.py']
