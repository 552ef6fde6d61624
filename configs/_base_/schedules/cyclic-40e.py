# The KITTI "cyclic" schedule of mmdet3d 1.4 (SECOND / PointPillars): AdamW; over the
# first 16 epochs the LR rises along a cosine from lr to 10 * lr (momentum falls to
# 0.85), then over 24 epochs it decays to lr * 1e-4 (momentum back to 0.95).
lr = 0.0018
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=lr, betas=(0.95, 0.99), weight_decay=0.01),
    clip_grad=dict(max_norm=10, norm_type=2))

param_scheduler = [
    dict(type='CosineAnnealingLR', T_max=16, eta_min=lr * 10, begin=0, end=16,
         by_epoch=True, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=24, eta_min=lr * 1e-4, begin=16, end=40,
         by_epoch=True, convert_to_iter_based=True),
    dict(type='CosineAnnealingMomentum', T_max=16, eta_min=0.85 / 0.95, begin=0, end=16,
         by_epoch=True, convert_to_iter_based=True),
    dict(type='CosineAnnealingMomentum', T_max=24, eta_min=1, begin=16, end=40,
         by_epoch=True, convert_to_iter_based=True),
]

train_cfg = dict(by_epoch=True, max_epochs=40, val_interval=1)
val_cfg = dict()
test_cfg = dict()

# base_batch_size: the total batch the LR was tuned for (8 GPUs x 6 samples)
auto_scale_lr = dict(enable=False, base_batch_size=48)
