# PointPillars KITTI 3-class on 4 GPU(s): 6 samples per GPU x 4 GPU(s) x 2 accumulation
# step(s) = effective batch 48, lr 0.001 (the stock 8 x 6 recipe unchanged). The scaling engine
# prints the plan at start; started on another GPU count it re-plans (same batch, LR).
#
#   bash tools/dist_train.sh configs/pointpillars/pointpillars_hv_secfpn_4xb6-acc2-160e_kitti-3d-3class.py 4
_base_ = ['./pointpillars_160e_kitti-3d-3class.py']
distributed = dict(sync_bn='torch')  # SyncBN over the 4 GPUs
