# PV-RCNN KITTI 3-class on 4 GPU(s): 2 samples per GPU x 4 GPU(s) x 2 accumulation
# step(s) = effective batch 16, lr 1e-3 (the 8 x 2 recipe unchanged). The scaling engine
# prints the plan at start; started on another GPU count it re-plans (same batch, LR).
#
#   bash tools/dist_train.sh configs/pv_rcnn/pv_rcnn_4xb2-acc2-80e_kitti-3d-3class.py 4
_base_ = ['./pv_rcnn_80e_kitti-3d-3class.py']
distributed = dict(sync_bn='allreduce')  # SyncBN over the 4 GPUs, no host sync per layer
