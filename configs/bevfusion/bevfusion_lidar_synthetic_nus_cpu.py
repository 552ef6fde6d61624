# BEVFusion LiDAR-only smoke recipe for a CPU (spconv 2.x) on synthetic nuScenes-format
# data: the official structure (basic-block sparse encoder, SECOND + SECONDFPN,
# TransFusion head with Hungarian assignment), shrunk for 2 CPU cores.
#
#   python tools/create_synthetic_data.py nuscenes --out data/synthetic_nuscenes \
#       --max-range 24 --samples-per-scene 5 --train-frames 600
#   python tools/train.py configs/bevfusion/bevfusion_lidar_synthetic_nus_cpu.py
#   python tools/test.py configs/bevfusion/bevfusion_lidar_synthetic_nus_cpu.py \
#       work_dirs/bevfusion_lidar_synthetic_nus_cpu/iter_300.pth
#
# --max-range 24 and short scenes keep 96 % of the evaluated boxes inside this
# recipe's 51.2 m x 51.2 m range (by default objects go up to the evaluation's
# 28-48 m class ranges: 64 % inside); 600 train frames make 120 scenes. The mAP /
# NDS this reaches: docs/parity.md, "nuScenes evaluation on the synthetic data".
#
# Differences to the official recipe, all for speed: 51.2 m x 51.2 m range with 0.2 m
# voxels (256 x 256 x 41 grid, BEV map 32 x 32; the official 108 m at 0.075 m is 1440),
# half the channels and one residual block per sparse stage, 2 blocks per BEV stage,
# 64 proposals, 1 sweep, smaller ObjectSample groups (never switched off), the stock
# RandomFlip3D (flips in both BEV directions, as BEVFusionRandomFlip3D does for
# LiDAR-only inputs); iteration-based, 300 optimizer steps of batch 2 with warmup and
# cosine decay, lr 2e-3. About 2-4 s an iteration on 2 shared CPU cores (spconv's CPU
# path); set OMP_NUM_THREADS=1 when the cores are shared with other work.
_base_ = ['./bevfusion_lidar_voxel0075_second_secfpn_cyclic-20e_nus-3d.py']

data_root = 'data/synthetic_nuscenes/'
voxel_size = [0.2, 0.2, 0.2]
point_cloud_range = [-25.6, -25.6, -5.0, 25.6, 25.6, 3.0]
grid_size = [256, 256, 41]
out_size_factor = 8
max_iters = 300
lr = 0.002

scaling = dict(total_batch_size=2, base_batch_size=2, lr_scaling='linear')

model = dict(
    data_preprocessor=dict(
        voxelize_cfg=dict(max_num_points=10, point_cloud_range=point_cloud_range,
                          voxel_size=voxel_size, max_voxels=[30000, 40000])),
    pts_middle_encoder=dict(
        sparse_shape=grid_size,
        base_channels=8,
        output_channels=64,
        encoder_channels=((8, 16), (16, 32), (32, 64), (64, )),
        encoder_paddings=((0, 1), (0, 1), (0, (1, 1, 0)), (0, ))),
    pts_backbone=dict(in_channels=128, out_channels=[64, 128], layer_nums=[2, 2]),
    pts_neck=dict(in_channels=[64, 128], out_channels=[64, 64]),
    bbox_head=dict(
        num_proposals=64,
        in_channels=128,
        hidden_channel=64,
        decoder_layer=dict(
            self_attn_cfg=dict(embed_dims=64, num_heads=4, dropout=0.1),
            cross_attn_cfg=dict(embed_dims=64, num_heads=4, dropout=0.1),
            ffn_cfg=dict(embed_dims=64, feedforward_channels=128),
            pos_encoding_cfg=dict(input_channel=2, num_pos_feats=64)),
        train_cfg=dict(point_cloud_range=point_cloud_range, grid_size=grid_size,
                       voxel_size=voxel_size, out_size_factor=out_size_factor),
        test_cfg=dict(grid_size=grid_size, out_size_factor=out_size_factor,
                      voxel_size=voxel_size[:2], pc_range=point_cloud_range[:2]),
        bbox_coder=dict(pc_range=point_cloud_range[:2],
                        post_center_range=[-30.0, -30.0, -10.0, 30.0, 30.0, 10.0],
                        out_size_factor=out_size_factor, voxel_size=voxel_size[:2])))

db_sampler = dict(
    data_root=data_root,
    info_path=data_root + 'nuscenes_dbinfos_train.pkl',
    rate=1.0,
    prepare=dict(
        filter_by_difficulty=[-1],
        filter_by_min_points=dict(car=5, truck=5, bus=5, trailer=5,
                                  construction_vehicle=5, traffic_cone=5, barrier=5,
                                  motorcycle=5, bicycle=5, pedestrian=5)),
    classes={{_base_.class_names}},
    sample_groups=dict(car=2, truck=1, construction_vehicle=1, bus=1, trailer=1,
                       barrier=1, motorcycle=1, bicycle=1, pedestrian=2,
                       traffic_cone=1),
    points_loader=dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=5,
                       use_dim=[0, 1, 2, 3, 4]))

load_points = [
    dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=5, use_dim=5),
    dict(type='LoadPointsFromMultiSweeps', sweeps_num=1, load_dim=5, use_dim=5,
         pad_empty_sweeps=True, remove_close=True),
]
train_pipeline = load_points + [
    dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True,
         with_attr_label=False),
    dict(type='ObjectSample', db_sampler=db_sampler),
    dict(type='GlobalRotScaleTrans', scale_ratio_range=[0.9, 1.1],
         rot_range=[-0.78539816, 0.78539816], translation_std=0.5),
    dict(type='RandomFlip3D', flip_ratio_bev_horizontal=0.5,
         flip_ratio_bev_vertical=0.5),
    dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectNameFilter', classes={{_base_.class_names}}),
    dict(type='PointShuffle'),
    dict(type='Pack3DDetInputs', keys=['points', 'gt_bboxes_3d', 'gt_labels_3d'],
         meta_keys=['box_type_3d', 'sample_idx', 'lidar_path',
                    'transformation_3d_flow', 'pcd_rotation', 'pcd_scale_factor',
                    'pcd_trans', 'lidar_aug_matrix'])
]
test_pipeline = load_points + [
    dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='Pack3DDetInputs', keys=['points'],
         meta_keys=['box_type_3d', 'sample_idx', 'lidar_path', 'num_pts_feats'])
]

train_dataloader = dict(
    batch_size=2,
    num_workers=1,
    persistent_workers=False,
    pin_memory=False,  # no GPU to copy to
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(dataset=dict(data_root=data_root, pipeline=train_pipeline)))
val_dataloader = dict(
    num_workers=1,
    persistent_workers=False,
    dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(data_root=data_root, ann_file=data_root + 'nuscenes_infos_val.pkl')
test_evaluator = val_evaluator

param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=30),
    dict(type='CosineAnnealingLR', T_max=max_iters - 30, eta_min=lr * 0.01,
         by_epoch=False, begin=30, end=max_iters),
]
optim_wrapper = dict(optimizer=dict(lr=lr))
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=max_iters)
auto_scale_lr = dict(enable=False, base_batch_size=2)

# iteration-based: ObjectSample stays on (no epoch to switch at)
custom_hooks = [dict(type='NonFiniteGuardHook'), dict(type='PreemptionHook')]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters))
log_processor = dict(by_epoch=False, window_size=20)
randomness = dict(seed=0)
