"""The main job: synthetic KITTI data -> train a reduced PointPillars -> KITTI metrics.

    python tools/demo.py [--work-dir DIR] [--iters N] [--cfg-options KEY=VALUE ...]

Generates ``data/synthetic_kitti`` when its infos are absent (only into an absent or
empty folder, or one the generator wrote before: never over other files), trains
``configs/demo/pointpillars_synthetic_kitti_cpu.py`` with mmengine's Runner (on the CPU
here, or one GPU when there is one), evaluates on the val split and prints the
metrics table with wall times. ``tools/train.py`` / ``tools/test.py`` run the same
config.
"""
import argparse
import json
import math
import os
import os.path as osp
import sys
import time
from typing import Dict, List, Optional

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)
# Before torch loads OpenMP: idle OpenMP threads sleep instead of spinning, which on a
# small, shared CPU (2 cores, data loading beside training) is several times faster.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

DEFAULT_CONFIG = osp.join(ROOT, 'configs', 'demo', 'pointpillars_synthetic_kitti_cpu.py')
CLASSES = ('Car', 'Pedestrian', 'Cyclist')
PREFIX = 'Kitti metric/pred_instances_3d/KITTI/'


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', default=DEFAULT_CONFIG, help='demo config')
    parser.add_argument('--work-dir', default='work_dirs/demo', help='logs, checkpoint')
    parser.add_argument('--iters', type=int, help='training iterations (config: 300)')
    parser.add_argument('--train-frames', type=int, default=200,
                        help='frames to generate for training when the data is absent')
    parser.add_argument('--val-frames', type=int, default=50,
                        help='frames to generate for evaluation when the data is absent')
    parser.add_argument('--seed', type=int, default=0, help='data and training seed')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config keys, e.g. train_dataloader.batch_size=2')
    return parser.parse_args(argv)


def set_iters(cfg, iters: int) -> None:
    """Retarget the iteration-based schedule of the demo config to ``iters``.

    A run at least as long as the warm-up keeps it (30 iterations) and ends the cosine
    decay at ``iters``; a shorter one scales every scheduler's ``begin`` / ``end`` by
    ``iters / max_iters`` (rounded up, at least one iteration each), since mmengine
    refuses a scheduler whose ``end`` is not above its ``begin``.
    """
    if iters < 1:
        raise SystemExit(f'demo.py: --iters must be a positive number of iterations, '
                         f'got {iters}.')
    configured = cfg.train_cfg.max_iters
    cfg.train_cfg.max_iters = iters
    cfg.train_cfg.val_interval = iters
    cfg.default_hooks.checkpoint.interval = iters
    if all(sched.get('begin', 0) < iters for sched in cfg.param_scheduler):
        for sched in cfg.param_scheduler:
            if sched.get('end', 0) > iters or sched['type'] == 'CosineAnnealingLR':
                sched['end'] = iters
        kept = list(cfg.param_scheduler)
    else:
        kept = []
        for sched in cfg.param_scheduler:
            begin = math.ceil(sched.get('begin', 0) * iters / configured)
            if begin >= iters:
                continue  # it would start after the run's end
            sched['begin'] = begin
            sched['end'] = max(begin + 1, min(iters, math.ceil(
                sched.get('end', configured) * iters / configured)))
            kept.append(sched)
    for sched in kept:
        if 'T_max' in sched:
            sched['T_max'] = sched['end'] - sched.get('begin', 0)
    cfg.param_scheduler = kept


_COLUMNS = (('3D', 'strict'), ('BEV', 'strict'), ('2D', 'strict'), ('3D', 'loose'),
            ('BEV', 'loose'))


def metrics_table(metrics: Dict[str, float]) -> str:
    """Moderate-difficulty AP40 per class and overall, strict and loose IoU."""
    head = f'{"AP40 moderate":<15}' + ''.join(f'{k + " " + iou:>12}' for k, iou in _COLUMNS)
    rows = [head]
    for name in CLASSES:
        vals = [metrics.get(f'{PREFIX}{name}_{k}_AP40_moderate_{iou}', float('nan'))
                for k, iou in _COLUMNS]
        rows.append(f'{name:<15}' + ''.join(f'{v:>12.2f}' for v in vals))
    overall = [metrics.get(f'{PREFIX}Overall_{k}_AP40_moderate', float('nan'))
               if iou == 'strict' else float('nan') for k, iou in _COLUMNS]
    rows.append(f'{"mAP (overall)":<15}' + ''.join(
        f'{v:>12.2f}' if v == v else f'{"":>12}' for v in overall))
    return '\n'.join(rows)


def main(argv: Optional[List[str]] = None) -> Dict[str, float]:
    args = parse_args(argv)
    t0 = time.perf_counter()
    import mmdet3d_scaling  # noqa: F401  (registers the plugin and its ScalingRunner)
    from mmengine.config import Config
    from mmengine.registry import RUNNERS

    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.iters:
        set_iters(cfg, args.iters)
    cfg.work_dir = args.work_dir
    cfg.randomness = dict(seed=args.seed)
    # evaluate once, after training, through runner.test()
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None
    from mmdet3d_scaling.datasets.synthetic.kitti import ensure_kitti
    data_gen_s = ensure_kitti(cfg.data_root, args.train_frames, args.val_frames, args.seed)

    t_train = time.perf_counter()
    runner = RUNNERS.build(cfg)  # runner_type='ScalingRunner' in the demo config
    runner.train()
    t_test = time.perf_counter()
    metrics = runner.test()
    t_end = time.perf_counter()

    summary = dict(
        iters=cfg.train_cfg.max_iters, data_gen_s=round(data_gen_s, 1),
        train_s=round(t_test - t_train, 1), test_s=round(t_end - t_test, 1),
        total_s=round(t_end - t0, 1),
        mAP_3d_moderate=round(float(metrics.get(f'{PREFIX}Overall_3D_AP40_moderate', -1)), 2),
        mAP_bev_moderate=round(float(metrics.get(f'{PREFIX}Overall_BEV_AP40_moderate', -1)),
                               2),
        car_3d_moderate=round(float(metrics.get(f'{PREFIX}Car_3D_AP40_moderate_strict', -1)),
                              2),
        metrics={k: float(v) for k, v in metrics.items()})
    os.makedirs(args.work_dir, exist_ok=True)
    with open(osp.join(args.work_dir, 'demo_summary.json'), 'w') as f:
        json.dump(summary, f, indent=1)
    print('\n[demo] KITTI AP40, moderate difficulty, val split '
          '(strict IoU: Car 0.7, Ped/Cyc 0.5; loose: Car 0.5, Ped/Cyc 0.25)')
    print(metrics_table(metrics))
    print(f"[demo] mAP (AP40, moderate): 3D {summary['mAP_3d_moderate']:.2f}, "
          f"BEV {summary['mAP_bev_moderate']:.2f}; "
          f"Car 3D (IoU 0.7) {summary['car_3d_moderate']:.2f}")
    print(f"[demo] wall time: data {summary['data_gen_s']} s, train {summary['train_s']} s "
          f"({summary['iters']} iters), test {summary['test_s']} s, "
          f"total {summary['total_s']} s; summary in {args.work_dir}/demo_summary.json")
    return summary


if __name__ == '__main__':
    try:
        main()
    except FileExistsError as err:  # ensure_kitti refused data_root: the reason, no traceback
        sys.exit(str(err))
