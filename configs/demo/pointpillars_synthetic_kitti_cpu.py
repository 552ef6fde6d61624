# The main job: a reduced PointPillars trained for a few hundred iterations on the CPU
# on synthetic KITTI-format data, then evaluated with the KITTI metric.
#
#   python tools/demo.py                       # generates the data if absent, trains, tests
#   python tools/create_synthetic_data.py kitti --out data/synthetic_kitti
#   python tools/train.py configs/demo/pointpillars_synthetic_kitti_cpu.py
#   python tools/test.py configs/demo/pointpillars_synthetic_kitti_cpu.py \
#       work_dirs/pointpillars_synthetic_kitti_cpu/iter_300.pth
#
# Same architecture as configs/_base_/models/pointpillars_hv_secfpn_kitti.py, shrunk
# for 2 CPU cores: 0.32 m pillars over 40.96 x 40.96 m (128 x 128 BEV grid, the
# synthetic objects lie 4-40 m ahead), half the pillar features, a quarter of the
# backbone channels, fewer blocks per stage.
_base_ = [
    '../_base_/models/pointpillars_hv_secfpn_kitti.py',
    '../_base_/datasets/kitti-3d-3class.py',
    '../_base_/schedules/cyclic-40e.py',
    '../_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmdet3d_scaling'], allow_failed_imports=False)
runner_type = 'ScalingRunner'  # the plugin's keys below are honoured by it
patches = ['speed']  # fewer GPU -> CPU waits in the heads: docs/patches.md

data_root = 'data/synthetic_kitti/'
class_names = ['Pedestrian', 'Cyclist', 'Car']
metainfo = dict(classes=class_names)
point_cloud_range = [0, -20.48, -3, 40.96, 20.48, 1]
voxel_size = [0.32, 0.32, 4]
ground_z = -1.73  # LiDAR height above the synthetic ground: anchors sit on it
max_iters = 300

# ------------------------------------------------------------------------- model
model = dict(
    data_preprocessor=dict(
        voxel_layer=dict(max_num_points=20, point_cloud_range=point_cloud_range,
                         voxel_size=voxel_size, max_voxels=(8000, 12000))),
    voxel_encoder=dict(feat_channels=[32], voxel_size=voxel_size,
                       point_cloud_range=point_cloud_range),
    middle_encoder=dict(in_channels=32, output_shape=[128, 128]),
    backbone=dict(in_channels=32, layer_nums=[1, 2, 2], layer_strides=[2, 2, 2],
                  out_channels=[32, 64, 128]),
    neck=dict(in_channels=[32, 64, 128], upsample_strides=[1, 2, 4],
              out_channels=[64, 64, 64]),
    bbox_head=dict(
        in_channels=192, feat_channels=192,
        anchor_generator=dict(ranges=[
            [0, -20.48, ground_z, 40.96, 20.48, ground_z],
            [0, -20.48, ground_z, 40.96, 20.48, ground_z],
            [0, -20.48, ground_z, 40.96, 20.48, ground_z],
        ])),
    # 0.64 m anchor spacing: a pedestrian's best anchor can overlap it by only ~0.2
    # (bird's-eye IoU), so the small classes accept lower overlaps than stock
    train_cfg=dict(assigner=[
        dict(type='Max3DIoUAssigner',
             iou_calculator=dict(type='mmdet3d.BboxOverlapsNearest3D'),
             pos_iou_thr=0.35, neg_iou_thr=0.2, min_pos_iou=0.15, ignore_iof_thr=-1),
        dict(type='Max3DIoUAssigner',
             iou_calculator=dict(type='mmdet3d.BboxOverlapsNearest3D'),
             pos_iou_thr=0.4, neg_iou_thr=0.25, min_pos_iou=0.2, ignore_iof_thr=-1),
        dict(type='Max3DIoUAssigner',
             iou_calculator=dict(type='mmdet3d.BboxOverlapsNearest3D'),
             pos_iou_thr=0.6, neg_iou_thr=0.45, min_pos_iou=0.45, ignore_iof_thr=-1),
    ]),
    test_cfg=dict(score_thr=0.1, nms_pre=100, max_num=50))

# -------------------------------------------------------------------------- data
db_sampler = dict(
    data_root=data_root,
    info_path=data_root + 'kitti_dbinfos_train.pkl',
    rate=1.0,
    prepare=dict(filter_by_difficulty=[-1],
                 filter_by_min_points=dict(Car=5, Pedestrian=5, Cyclist=5)),
    classes=class_names,
    sample_groups=dict(Car=12, Pedestrian=8, Cyclist=8),
    points_loader=dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=4,
                       use_dim=4))
train_pipeline = [
    dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=4, use_dim=4),
    dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True),
    dict(type='ObjectSample', db_sampler=db_sampler, use_ground_plane=True),
    dict(type='RandomFlip3D', flip_ratio_bev_horizontal=0.5),
    dict(type='GlobalRotScaleTrans', rot_range=[-0.39269908, 0.39269908],
         scale_ratio_range=[0.95, 1.05]),
    dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='PointShuffle'),
    dict(type='Pack3DDetInputs', keys=['points', 'gt_labels_3d', 'gt_bboxes_3d'])
]
test_pipeline = [
    dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=4, use_dim=4),
    dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='Pack3DDetInputs', keys=['points'])
]
train_dataloader = dict(
    batch_size=4,
    num_workers=1,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(times=1, dataset=dict(data_root=data_root, pipeline=train_pipeline,
                                       metainfo=metainfo)))
val_dataloader = dict(
    num_workers=1,
    dataset=dict(data_root=data_root, pipeline=test_pipeline, metainfo=metainfo))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'kitti_infos_val.pkl')
test_evaluator = val_evaluator

# ---------------------------------------------------------------------- schedule
lr = 0.003
optim_wrapper = dict(optimizer=dict(lr=lr), clip_grad=dict(max_norm=35, norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=30),
    dict(type='CosineAnnealingLR', T_max=max_iters - 30, eta_min=lr * 0.05,
         by_epoch=False, begin=30, end=max_iters),
]
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=max_iters)
auto_scale_lr = dict(base_batch_size=4)

default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters),
    visualization=dict(type='Det3DVisualizationHook'))
log_processor = dict(by_epoch=False, window_size=20)
randomness = dict(seed=0)
