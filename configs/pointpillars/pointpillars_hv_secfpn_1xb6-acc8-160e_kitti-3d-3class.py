# PointPillars KITTI 3-class on 1 GPU(s): 6 samples per GPU x 1 GPU(s) x 8 accumulation
# step(s) = effective batch 48, lr 0.001 (the stock 8 x 6 recipe unchanged). The scaling engine
# prints the plan at start; started on another GPU count it re-plans (same batch, LR).
#
#   bash tools/dist_train.sh configs/pointpillars/pointpillars_hv_secfpn_1xb6-acc8-160e_kitti-3d-3class.py 1
_base_ = ['./pointpillars_160e_kitti-3d-3class.py']
# one GPU: python tools/train.py configs/pointpillars/pointpillars_hv_secfpn_1xb6-acc8-160e_kitti-3d-3class.py
