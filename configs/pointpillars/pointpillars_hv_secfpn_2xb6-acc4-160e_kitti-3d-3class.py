# PointPillars KITTI 3-class on 2 GPU(s): 6 samples per GPU x 2 GPU(s) x 4 accumulation
# step(s) = effective batch 48, lr 0.001 (the stock 8 x 6 recipe unchanged). The scaling engine
# prints the plan at start; started on another GPU count it re-plans (same batch, LR).
#
#   bash tools/dist_train.sh configs/pointpillars/pointpillars_hv_secfpn_2xb6-acc4-160e_kitti-3d-3class.py 2
_base_ = ['./pointpillars_160e_kitti-3d-3class.py']
distributed = dict(sync_bn='torch')  # SyncBN over the 2 GPUs
