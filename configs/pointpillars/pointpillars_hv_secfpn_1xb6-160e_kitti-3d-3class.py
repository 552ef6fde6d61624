# Alias: the former name of configs/pointpillars/pointpillars_hv_secfpn_1xb6-acc8-160e_kitti-3d-3class.py
# (renamed to mmdet3d's rule {algorithm}_{components}_{N}xb{B}[-amp][-accK]-{schedule}_{dataset},
# docs/configs.md). Kept so commands and work dirs that use this name still work.
_base_ = ['./pointpillars_hv_secfpn_1xb6-acc8-160e_kitti-3d-3class.py']
