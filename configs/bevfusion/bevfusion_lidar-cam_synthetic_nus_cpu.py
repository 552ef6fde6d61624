# BEVFusion LiDAR + camera smoke recipe for a CPU on synthetic nuScenes-format data
# (6 cameras, 256 x 704 images): the official structure (Swin backbone,
# GeneralizedLSSFPN, DepthLSSTransform with the LiDAR depth map, ConvFuser) shrunk for
# 2 CPU cores, on top of the LiDAR-only smoke recipe.
#
#   python tools/create_synthetic_data.py nuscenes --out data/synthetic_nuscenes \
#       --max-range 24 --samples-per-scene 5 --train-frames 600
#   python tools/train.py configs/bevfusion/bevfusion_lidar-cam_synthetic_nus_cpu.py
#   python tools/test.py configs/bevfusion/bevfusion_lidar-cam_synthetic_nus_cpu.py \
#       work_dirs/bevfusion_lidar-cam_synthetic_nus_cpu/iter_300.pth
#
# --max-range 24 and short scenes keep 96 % of the evaluated boxes inside this
# recipe's 51.2 m x 51.2 m range (by default objects go up to the evaluation's
# 28-48 m class ranges: 64 % inside); 600 train frames make 120 scenes. The mAP /
# NDS this reaches: docs/parity.md, "nuScenes evaluation on the synthetic data".
#
# Differences to the official camera branch, all for speed: 64 x 192 network images
# (resize ~0.29 instead of ~0.48), a Swin of one block per stage and 24 base channels
# (no pretrained weights), a 32-channel neck, 16 BEV channels, 2 m depth bins up to
# 41 m, a 0.8 m BEV grid over the LiDAR recipe's 51.2 m x 51.2 m (64 x 64 cells, 32 x 32
# after the stride-2 downsample, as the LiDAR BEV map). The lean pooling path is on.
_base_ = ['./bevfusion_lidar_synthetic_nus_cpu.py']

point_cloud_range = [-25.6, -25.6, -5.0, 25.6, 25.6, 3.0]
input_modality = dict(use_lidar=True, use_camera=True)
final_dim = [64, 192]  # multiples of 32: the data preprocessor pads to 32
feature_size = [8, 24]  # final_dim / 8 (the neck's finest output: Swin stage 2)
cam_bev_channels = 16
lidar_bev_channels = 128  # the LiDAR smoke recipe's sparse encoder output

model = dict(
    data_preprocessor=dict(
        mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], bgr_to_rgb=False),
    img_backbone=dict(
        type='mmdet.SwinTransformer',
        embed_dims=24,
        depths=[1, 1, 1, 1],
        num_heads=[1, 2, 4, 8],
        window_size=7,
        mlp_ratio=2,
        qkv_bias=True,
        qk_scale=None,
        drop_rate=0.0,
        attn_drop_rate=0.0,
        drop_path_rate=0.1,
        patch_norm=True,
        out_indices=[1, 2, 3],
        with_cp=False,
        convert_weights=False,
        init_cfg=None),
    img_neck=dict(
        type='GeneralizedLSSFPN',
        in_channels=[48, 96, 192],
        out_channels=32,
        start_level=0,
        num_outs=3,
        norm_cfg=dict(type='BN2d', requires_grad=True),
        act_cfg=dict(type='ReLU', inplace=True),
        upsample_cfg=dict(mode='bilinear', align_corners=False)),
    view_transform=dict(
        type='DepthLSSTransform',
        in_channels=32,
        out_channels=cam_bev_channels,
        image_size=final_dim,
        feature_size=feature_size,
        xbound=[-25.6, 25.6, 0.8],
        ybound=[-25.6, 25.6, 0.8],
        zbound=[-10.0, 10.0, 20.0],
        dbound=[1.0, 41.0, 2.0],
        downsample=2,
        memory_efficient=True),
    fusion_layer=dict(
        type='ConvFuser', in_channels=[cam_bev_channels, lidar_bev_channels],
        out_channels=lidar_bev_channels))

meta_keys = [
    'cam2img', 'ori_cam2img', 'lidar2cam', 'lidar2img', 'cam2lidar', 'ori_lidar2img',
    'img_aug_matrix', 'box_type_3d', 'sample_idx', 'lidar_path', 'img_path',
    'transformation_3d_flow', 'pcd_rotation', 'pcd_scale_factor', 'pcd_trans',
    'lidar_aug_matrix', 'num_pts_feats'
]
load_points = [
    dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=5, use_dim=5),
    dict(type='LoadPointsFromMultiSweeps', sweeps_num=1, load_dim=5, use_dim=5,
         pad_empty_sweeps=True, remove_close=True),
]
train_pipeline = [
    dict(type='BEVLoadMultiViewImageFromFiles', to_float32=True, color_type='color',
         num_views=6),
    *load_points,
    dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True,
         with_attr_label=False),
    dict(type='ImageAug3D', final_dim=final_dim, resize_lim=[0.28, 0.31],
         bot_pct_lim=[0.0, 0.0], rot_lim=[-5.4, 5.4], rand_flip=True, is_train=True),
    dict(type='BEVFusionGlobalRotScaleTrans', scale_ratio_range=[0.9, 1.1],
         rot_range=[-0.78539816, 0.78539816], translation_std=0.5),
    dict(type='BEVFusionRandomFlip3D'),
    dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectNameFilter', classes={{_base_.class_names}}),
    dict(type='GridMask', use_h=True, use_w=True, max_epoch=6, rotate=1, offset=False,
         ratio=0.5, mode=1, prob=0.0, fixed_prob=True),
    dict(type='PointShuffle'),
    dict(type='Pack3DDetInputs',
         keys=['points', 'img', 'gt_bboxes_3d', 'gt_labels_3d'], meta_keys=meta_keys)
]
test_pipeline = [
    dict(type='BEVLoadMultiViewImageFromFiles', to_float32=True, color_type='color',
         num_views=6),
    *load_points,
    dict(type='ImageAug3D', final_dim=final_dim, resize_lim=[0.29, 0.29],
         bot_pct_lim=[0.0, 0.0], rot_lim=[0.0, 0.0], rand_flip=False, is_train=False),
    dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='Pack3DDetInputs', keys=['img', 'points', 'gt_bboxes_3d', 'gt_labels_3d'],
         meta_keys=meta_keys)
]
train_dataloader = dict(
    dataset=dict(dataset=dict(pipeline=train_pipeline, modality=input_modality)))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline, modality=input_modality))
test_dataloader = val_dataloader
