"""Command line of the parity benchmark (``tools/benchmark_parity.py``).

Parity benchmark: does one config train to the same model on any process count?

Trains CONFIG in several arrangements of the same effective batch T = B x K, each with
several seeds, through tools/train.py (tools/dist_train.sh for N processes) and
tools/test.py, and writes under --out: ``parity.json`` (every run's overrides, seed,
metrics, loss per optimizer step, wall time; per arrangement mean / std / min / max),
``parity.png`` (loss curves, band = seed range) and ``runs/<arrangement>/seed<S>/``.
Arrangements: ``1proc_bB_accK`` (reference), ``1proc_bT``, ``Nproc_bB_acc{K/N}`` for each
--nproc, and with --stock the config as written. Library: :mod:`.parity`; docs/parity.md.
"""
import argparse
import os.path as osp
import sys
from typing import List, Optional


def _int_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(',') if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(
            f'expected comma-separated integers (e.g. 0,1,2), got {text!r}')
    return values


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from mmengine.config import DictAction
    p = argparse.ArgumentParser(
        prog='benchmark_parity.py',
        description='Parity benchmark: does one config train to the same model on any '
                    'process count?')
    p.add_argument('config', help='config file')
    p.add_argument('--batch', type=int, required=True,
                   help='micro-batch B of the 1-process reference')
    p.add_argument('--accumulation', type=int, required=True,
                   help='accumulation K of the reference; B x K = the effective batch')
    p.add_argument('--nproc', type=_int_list, default=[2],
                   help='process counts > 1, comma-separated (default 2); each runs '
                        'B x K/N (gloo on a CPU, NCCL on GPUs)')
    p.add_argument('--seeds', type=_int_list, default=[0, 1, 2],
                   help='seeds, comma-separated (default 0,1,2)')
    p.add_argument('--iters', type=int,
                   help='optimizer steps (default: the config\'s schedule); the '
                        'iteration-based schedule is compressed to it')
    p.add_argument('--stock', action='store_true',
                   help='also the config as written (no scaling overrides)')
    p.add_argument('--only', type=lambda t: [n for n in t.split(',') if n],
                   help='run only these arrangements, comma-separated names')
    p.add_argument('--data-root', help='dataset root replacing the config\'s data_root '
                                       'in every path derived from it')
    p.add_argument('--out', default='work_dirs/parity', help='output folder')
    p.add_argument('--jobs', type=int, default=1,
                   help='runs at a time (default 1). They share the machine: on one '
                        'large GPU several 1-process runs fit at once; their wall times '
                        'are then no speed figure')
    p.add_argument('--dry-run', action='store_true', help='print the commands, run none')
    p.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                   help='overrides for every run, e.g. model.backbone.norm_eval=True')
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    from . import parity
    try:
        bench = parity.prepare(args.config, args.out, args.batch, args.accumulation,
                               args.seeds, args.nproc, args.iters, args.stock,
                               args.data_root, args.cfg_options, args.only)
    except parity.ParityError as err:
        sys.exit(f'benchmark_parity: error: {err}')
    print(f'[parity] effective batch {bench.header["total_batch"]} '
          f'({bench.header["total_batch_from"]}); arrangements: '
          f'{", ".join(a.name for a in bench.arrangements)}; seeds {args.seeds}')
    if args.dry_run:
        print('\n'.join(parity.dry_run_lines(bench)))
        return 0
    try:
        report = parity.run_benchmark(bench, args.out, jobs=args.jobs)
    except parity.ParityError as err:
        sys.exit(f'benchmark_parity: error: {err}')
    print(parity.markdown_table(report['summary']))
    print(f'[parity] {osp.join(args.out, "parity.json")}, '
          f'{osp.join(args.out, "parity.png")}')
    failed = [r for r in report['runs'] if r.get('status') != 'ok']
    return 1 if failed else 0

