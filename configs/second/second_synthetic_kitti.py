# A small SECOND on synthetic KITTI-format data with the scaling engine's recipe:
# effective batch 8 on any GPU/process count. Same data, pipeline and schedule as
# configs/pointpillars/pointpillars_synthetic_kitti.py; the model is stock SECOND's
# structure (HardSimpleVFE, SparseEncoder, SECOND + SECONDFPN, Anchor3DHead) shrunk for
# CPU smoke runs: 0.16 x 0.16 x 0.1 m voxels over 40.96 x 40.96 x 4 m (256 x 256 x 41
# grid, BEV map 32 x 32), 2 blocks per BEV stage, half the BEV channels. On a CPU the
# sparse convolutions run on spconv's CPU path.
#
#   python tools/create_synthetic_data.py kitti --out data/synthetic_kitti
#   python tools/train.py configs/second/second_synthetic_kitti.py
_base_ = ['../pointpillars/pointpillars_synthetic_kitti.py']

point_cloud_range = [0, -20.48, -3, 40.96, 20.48, 1]
voxel_size = [0.16, 0.16, 0.1]
ground_z = -1.73

model = dict(
    _delete_=True,
    type='VoxelNet',
    data_preprocessor=dict(
        type='Det3DDataPreprocessor', voxel=True,
        voxel_layer=dict(max_num_points=5, point_cloud_range=point_cloud_range,
                         voxel_size=voxel_size, max_voxels=(16000, 40000))),
    voxel_encoder=dict(type='HardSimpleVFE'),
    middle_encoder=dict(type='SparseEncoder', in_channels=4, sparse_shape=[41, 256, 256],
                        order=('conv', 'norm', 'act')),
    backbone=dict(type='SECOND', in_channels=256, layer_nums=[2, 2], layer_strides=[1, 2],
                  out_channels=[64, 128]),
    neck=dict(type='SECONDFPN', in_channels=[64, 128], upsample_strides=[1, 2],
              out_channels=[64, 64]),
    bbox_head=dict(
        type='Anchor3DHead', num_classes=3, in_channels=128, feat_channels=128,
        use_direction_classifier=True,
        anchor_generator=dict(
            type='Anchor3DRangeGenerator',
            ranges=[[0, -20.48, ground_z, 40.96, 20.48, ground_z]] * 3,
            sizes=[[0.8, 0.6, 1.73], [1.76, 0.6, 1.73], [3.9, 1.6, 1.56]],
            rotations=[0, 1.57], reshape_out=False),
        diff_rad_by_sin=True,
        bbox_coder=dict(type='DeltaXYZWLHRBBoxCoder'),
        loss_cls=dict(type='mmdet.FocalLoss', use_sigmoid=True, gamma=2.0, alpha=0.25,
                      loss_weight=1.0),
        loss_bbox=dict(type='mmdet.SmoothL1Loss', beta=1.0 / 9.0, loss_weight=2.0),
        loss_dir=dict(type='mmdet.CrossEntropyLoss', use_sigmoid=False,
                      loss_weight=0.2)),
    # the demo's assigners (coarse anchors on synthetic data, see its config)
    train_cfg=dict(
        assigner=[
            dict(type='Max3DIoUAssigner',
                 iou_calculator=dict(type='mmdet3d.BboxOverlapsNearest3D'),
                 pos_iou_thr=0.35, neg_iou_thr=0.2, min_pos_iou=0.15, ignore_iof_thr=-1),
            dict(type='Max3DIoUAssigner',
                 iou_calculator=dict(type='mmdet3d.BboxOverlapsNearest3D'),
                 pos_iou_thr=0.4, neg_iou_thr=0.25, min_pos_iou=0.2, ignore_iof_thr=-1),
            dict(type='Max3DIoUAssigner',
                 iou_calculator=dict(type='mmdet3d.BboxOverlapsNearest3D'),
                 pos_iou_thr=0.6, neg_iou_thr=0.45, min_pos_iou=0.45, ignore_iof_thr=-1),
        ],
        allowed_border=0, pos_weight=-1, debug=False),
    test_cfg=dict(use_rotate_nms=True, nms_across_levels=False, nms_thr=0.01,
                  score_thr=0.1, min_bbox_size=0, nms_pre=100, max_num=50))
