#!/usr/bin/env python
"""Will it fit my card? What the fastest fit (``scaling.memory_budget``) would train one
config with, for several GPU memory budgets.

Per budget: per-GPU batch, accumulation, gradient checkpointing, precision, samples/s
and the peaks after warm-up (allocated, reserved), as a table; every variant per
budget in a JSON file (``--out``, default ``WORK_DIR/fit_table.json``). One search at
the largest budget; smaller budgets are decided from its trials and train again only
what those cannot decide (:mod:`mmdet3d_scaling.diagnostics.fit_table` says why that
is the search's answer). Nothing is trained after it and no weights are loaded.

Usage (on the GPU)::

    python tools/analysis/fit_table.py configs/bevfusion_1gpu.py --budgets 12,16,24,40,80
    python tools/analysis/fit_table.py CONFIG --budgets 1536MiB,3GiB --batch-sizes 8,4,2,1
    # CPU dry run on a modelled device (sizes in MiB)
    python tools/analysis/fit_table.py configs/demo/pointpillars_synthetic_kitti_cpu.py \\
        --budgets 40MiB,80MiB --probe modeled --capacity-mib 1024 --mib-per-sample 8
"""
import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from mmengine.config import DictAction

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mmdet3d_scaling.diagnostics import fit_table  # noqa: E402


def _batch_sizes(text: str) -> List[int]:
    try:
        sizes = [int(b) for b in text.split(',') if b.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f'{text!r} is not a list of positive per-GPU batches: write e.g. 8,4,2,1 '
            '(divisors of scaling.total_batch_size)')
    return sizes


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f'{text} is not a share in [0, 1): write e.g. '
                                         '0.1 keeps a tenth of each budget free')
    return value


def _steps(least: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f'{text} steps: need at least {least}')
        return value
    return parse


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('config', help='config file (plugin configs; others get '
                   'scaling.total_batch_size = their train_dataloader.batch_size)')
    p.add_argument('--budgets', default='12,16,24,40,80',
                   help='GPU memory budgets, comma-separated: numbers are GiB, or sizes '
                   "with a unit (1536MiB, 24GiB, 24GB); default 12,16,24,40,80")
    p.add_argument('--batch-sizes', type=_batch_sizes,
                   help='per-GPU batches to try, e.g. 8,4,2,1 (divisors of the total '
                   "batch); default: the fastest fit's own (divisors up to the config's "
                   'per-GPU batch)')
    p.add_argument('--margin', type=_share,
                   help='share of each budget kept free (default: the hook\'s, 0.1)')
    p.add_argument('--warmup-steps', type=_steps(0),
                   help='untimed training steps per trial (default 2)')
    p.add_argument('--timed-steps', type=_steps(1),
                   help='timed training steps per trial (default 3)')
    p.add_argument('--min-gain', type=float,
                   help='share by which a smaller batch or checkpointing must be faster '
                   'to be chosen over a variant earlier in the order (default 0.02)')
    p.add_argument('--work-dir', help='default: work_dirs/fit_table/CONFIG_NAME')
    p.add_argument('--out', help='JSON output path (default: WORK_DIR/fit_table.json)')
    p.add_argument('--probe', choices=('cuda', 'modeled'), default='cuda',
                   help="'cuda' (default): this GPU; 'modeled': a modelled device for a "
                   'dry run without a GPU (the --*-mib flags)')
    p.add_argument('--capacity-mib', type=float, default=1024.0,
                   help='modelled device: memory, MiB')
    p.add_argument('--mib-per-sample', type=float, default=16.0,
                   help='modelled device: MiB a sample without checkpointing')
    p.add_argument('--checkpointed-mib-per-sample', type=float,
                   help='modelled device: MiB a sample with checkpointing on '
                   '(default: as without)')
    p.add_argument('--fixed-mib', type=float,
                   help='modelled device: fixed MiB (default: the measured parameters '
                   'and gradients)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override config keys (key=value), e.g. '
                   'model.img_backbone.init_cfg=None')
    args = p.parse_args(argv)
    try:
        fit_table.parse_budgets(args.budgets)
    except ValueError as err:
        p.error(str(err))
    if args.probe == 'cuda' and not fit_table.cuda_available():
        p.error('no CUDA device here: run it on the GPU whose memory you ask about, or '
                'pass --probe modeled for a dry run on a modelled device')
    return args


def hook_options(args: argparse.Namespace) -> Dict[str, Any]:
    """FastestFitHook's options the command line sets (None: the hook's default)."""
    return dict(batch_sizes=args.batch_sizes, margin=args.margin,
                warmup_steps=args.warmup_steps, timed_steps=args.timed_steps,
                min_gain=args.min_gain)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    modelled = dict(capacity_mib=args.capacity_mib, mib_per_sample=args.mib_per_sample,
                    checkpointed_mib_per_sample=args.checkpointed_mib_per_sample,
                    fixed_mib=args.fixed_mib)
    try:
        result = fit_table.run(args.config, args.budgets, hook_options(args),
                               args.probe, modelled, args.work_dir, args.cfg_options)
    except FileNotFoundError as err:
        if not str(err).startswith('config '):
            raise
        sys.exit(f'error: {err}')
    except RuntimeError as err:  # the search's own error lists every trial
        if not str(err).startswith('fastest fit: no variant trains'):
            raise
        sys.exit(f'{err}\nfit table: nothing trains in the largest budget '
                 f'({fit_table.parse_budgets(args.budgets)[-1][0]}), so nothing does in a '
                 'smaller one.')
    print(fit_table.table(result))
    data = fit_table.to_json(result)
    out = args.out or fit_table.default_out(result['work_dir'])
    fit_table.write_json(data, out)
    print(f'written: {out}')
    return data


if __name__ == '__main__':
    main()
