# PV-RCNN KITTI 3-class on 1 GPU(s): 2 samples per GPU x 1 GPU(s) x 8 accumulation
# step(s) = effective batch 16, lr 1e-3 (the 8 x 2 recipe unchanged). The scaling engine
# prints the plan at start; started on another GPU count it re-plans (same batch, LR).
#
#   bash tools/dist_train.sh configs/pv_rcnn/pv_rcnn_1xb2-acc8-80e_kitti-3d-3class.py 1
_base_ = ['./pv_rcnn_80e_kitti-3d-3class.py']
# one GPU: python tools/train.py configs/pv_rcnn/pv_rcnn_1xb2-acc8-80e_kitti-3d-3class.py
