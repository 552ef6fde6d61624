# PV-RCNN KITTI 3-class on 2 GPU(s): 2 samples per GPU x 2 GPU(s) x 4 accumulation
# step(s) = effective batch 16, lr 1e-3 (the 8 x 2 recipe unchanged). The scaling engine
# prints the plan at start; started on another GPU count it re-plans (same batch, LR).
#
#   bash tools/dist_train.sh configs/pv_rcnn/pv_rcnn_2xb2-acc4-80e_kitti-3d-3class.py 2
_base_ = ['./pv_rcnn_80e_kitti-3d-3class.py']
distributed = dict(sync_bn='allreduce')  # SyncBN over the 2 GPUs, no host sync per layer
