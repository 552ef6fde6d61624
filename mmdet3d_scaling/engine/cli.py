"""Command lines of ``tools/train.py`` and ``tools/test.py``.

The same flags as mmdet3d 1.4's tools (so scripts written for them keep working), plus:

- ``--launcher auto``: detect torchrun / Slurm (an ``srun`` step) / MPI from the
  environment;
- launch checks (:func:`mmdet3d_scaling.parallel.launcher.check_launch`): no ``--launcher``
  under torchrun / srun / mpirun stops (the processes would train apart in one work
  dir); an explicit launcher without its variables stops, naming them;
- one training run per work dir (:mod:`mmdet3d_scaling.engine.work_dir_lock`): rank 0
  takes the work dir's lock before the runner is built;
- ``--trust-checkpoint PATH``: allow full unpickling of that one checkpoint file;
- ``--seed`` / ``--deterministic`` (train): ``randomness`` settings, seeded per rank.
"""
import argparse
import logging
import os
import os.path as osp
from typing import List, Optional

from mmengine.config import Config, ConfigDict, DictAction
from mmengine.logging import print_log
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ..patches.fixes.checkpoint import trust_checkpoints
from ..parallel.launcher import CHOICES as LAUNCHER_CHOICES
from ..parallel.launcher import check_launch, launch_rank, resolve_launcher, shutdown_distributed
from .work_dir_lock import locked_work_dir


def _common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--work-dir', help='directory for logs, checkpoints, metrics')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config keys, e.g. train_dataloader.batch_size=2')
    parser.add_argument(
        '--launcher', choices=LAUNCHER_CHOICES, default='none',
        help="job launcher; 'auto' detects torchrun / Slurm / MPI, else single process")
    parser.add_argument(
        '--trust-checkpoint', action='append', default=[], metavar='PATH',
        help='checkpoint file you trust: load it with full unpickling (repeatable)')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0,
                        help='set by torch.distributed.launch (LOCAL_RANK wins when set); '
                             'not needed with torchrun')


def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description='Train a 3D detector (mmdet3d-scaling)')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--amp', action='store_true',
                        help='automatic mixed precision (bf16 autocast on a CPU)')
    parser.add_argument('--sync_bn', choices=['none', 'torch', 'mmcv'], default='none',
                        help='convert BatchNorm layers to SyncBatchNorm when distributed')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the LR by the real effective batch size')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='checkpoint to resume from; no value: the latest in work dir')
    parser.add_argument('--seed', type=int, help='random seed (offset by rank)')
    parser.add_argument('--deterministic', action='store_true',
                        help='deterministic cuDNN / torch algorithms')
    _common_args(parser)
    return parser


def test_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description='Test (and evaluate) a 3D detector')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--show', action='store_true', help='show predictions')
    parser.add_argument('--show-dir', help='directory for painted predictions')
    parser.add_argument('--score-thr', type=float, default=0.1, help='box score threshold')
    parser.add_argument('--task', choices=['mono_det', 'multi-view_det', 'lidar_det',
                                           'lidar_seg', 'multi-modality_det'],
                        help='visualisation task (with --show / --show-dir)')
    parser.add_argument('--wait-time', type=float, default=2, help='show interval (s)')
    parser.add_argument('--tta', action='store_true', help='test-time augmentation')
    _common_args(parser)
    return parser


def load_config(args: argparse.Namespace) -> Config:
    """Config file + CLI overrides + work dir + launcher, as mmdet3d's tools do."""
    if not osp.isfile(args.config):
        raise FileNotFoundError(f'config file {args.config} does not exist')
    launcher = resolve_launcher(args.launcher)
    check_launch(args.launcher, launcher)  # before LOCAL_RANK below fakes a variable
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    cfg.launcher = launcher
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    if args.trust_checkpoint:
        trust_checkpoints(args.trust_checkpoint)
    return cfg


def _enable_amp(cfg: Config) -> None:
    wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if wrapper == 'AmpOptimWrapper':
        print_log('AMP training is already enabled in your config.',
                  logger='current', level=logging.WARNING)
        return
    if wrapper != 'OptimWrapper':
        raise ValueError(f'--amp needs optim_wrapper.type OptimWrapper, got {wrapper!r}')
    # loss_scale left unset: AmpOptimWrapper defaults to 'dynamic', and a legacy
    # `fp16 = dict(loss_scale=...)` in the config then fills it without a conflict.
    cfg.optim_wrapper.type = 'AmpOptimWrapper'


def _build_runner(cfg: Config) -> Runner:
    return Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)


def train_main(argv: Optional[List[str]] = None) -> Runner:
    args = train_parser().parse_args(argv)
    cfg = load_config(args)
    if args.amp:
        _enable_amp(cfg)
    if args.sync_bn != 'none':  # the plugin's wrapper converts it (also on a CPU)
        cfg.merge_from_dict({'distributed.sync_bn': args.sync_bn})
    if args.auto_scale_lr:
        if 'base_batch_size' not in cfg.get('auto_scale_lr', {}):
            raise ValueError('--auto-scale-lr needs auto_scale_lr.base_batch_size in the '
                             'config (the total batch size the LR was tuned for).')
        cfg.auto_scale_lr.enable = True
    if args.seed is not None or args.deterministic:
        randomness = dict(cfg.get('randomness') or {})
        if args.seed is not None:
            randomness['seed'] = args.seed
        randomness['deterministic'] = args.deterministic
        randomness.setdefault('diff_rank_seed', True)
        cfg.randomness = randomness
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    # Rank 0 holds the work dir from before the runner is built (which already writes
    # the config dump and logs there) to the end; ScalingRunner.train() re-enters it.
    lock = locked_work_dir(cfg.work_dir, launch_rank(cfg.launcher))
    try:
        runner = _build_runner(cfg)
        runner.train()
        shutdown_distributed(runner)
    finally:
        if lock is not None:
            lock.release()
    return runner


def _trigger_visualization(cfg: Config, args: argparse.Namespace) -> None:
    hooks = cfg.default_hooks
    if 'visualization' not in hooks:
        raise ValueError("--show/--show-dir need default_hooks.visualization "
                         "(dict(type='Det3DVisualizationHook')) in the config")
    if args.task is None:
        raise ValueError('--show/--show-dir need --task')
    vis = hooks['visualization']
    vis.update(draw=True, vis_task=args.task, score_thr=args.score_thr)
    if args.show:
        vis.update(show=True, wait_time=args.wait_time)
    if args.show_dir:
        vis['test_out_dir'] = args.show_dir


def test_main(argv: Optional[List[str]] = None) -> dict:
    args = test_parser().parse_args(argv)
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    # ScalingRunner checks that the checkpoint fits the model: scoring a random model is
    # never what `tools/test.py CONFIG CKPT` is for (`--cfg-options resume_strict=False`)
    cfg.setdefault('resume_strict', True)
    if args.show or args.show_dir:
        _trigger_visualization(cfg, args)
    if args.tta:
        if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
            raise ValueError('--tta needs tta_model and tta_pipeline in the config')
        cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
        cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
    metrics = _build_runner(cfg).test()
    shutdown_distributed()
    return metrics
