#!/usr/bin/env python
"""Scaling benchmark: train a config for a fixed number of steps on 1..N GPUs, measure.

Trains the config on each process count of ``--nproc`` with the same effective batch and
writes ``scaling.json``, ``scaling.md`` and ``scaling.png`` under ``--out``: samples/s,
speedup, efficiency, data wait, memory, step times, exposed communication, and with
options profiles, independent runs, a DDP world of one, repeated rounds and a stock
mmdet3d comparison. What each figure means:
:mod:`mmdet3d_scaling.diagnostics.scaling_benchmark` (the library this command runs).

Examples::

    # 1 and 2 GPUs of one machine
    python tools/benchmark_scaling.py configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \
        --nproc 1,2 --iters 30 --warmup 5 --out work_dirs/bench_pv_rcnn
    # CPU (gloo), for testing the tool itself
    python tools/benchmark_scaling.py configs/pointpillars/pointpillars_synthetic_kitti.py \
        --devices cpu --nproc 1,2 --iters 3 --warmup 1 --out /tmp/bench
    # multi-node (run the same command on every node; node 0 writes the results):
    python tools/benchmark_scaling.py CONFIG --nproc 8 --nnodes 2 --node-rank $NODE_RANK \
        --master-addr $MASTER_ADDR --master-port 29500 --out work_dirs/bench_2x8
"""
import argparse
import os.path as osp
import sys
from typing import Any, Dict, List, Optional

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))


def _parse_nproc(text: str) -> List[int]:
    """--nproc: comma-separated positive counts, sorted, each once."""
    try:
        values = [int(v) for v in text.split(',') if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f'--nproc must be a comma-separated list of positive ints (e.g. 1,2,4), '
            f'got {text!r}')
    return sorted(set(values))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The options, checked against each other (errors exit with argparse's usage)."""
    from mmengine.config import DictAction
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('config', help='config file (plugin config with a scaling key)')
    p.add_argument('--nproc', type=_parse_nproc, default=[1, 2],
                   help='process (GPU) counts per node, comma-separated (default 1,2)')
    p.add_argument('--devices', choices=('cuda', 'cpu'), default='cuda',
                   help='cuda: one GPU a process (NCCL); cpu: gloo, for testing the tool')
    p.add_argument('--iters', type=int, default=30, help='measured optimizer steps')
    p.add_argument('--warmup', type=int, default=5,
                   help='optimizer steps trained before the measurement starts')
    p.add_argument('--warmup-iters', type=int, default=0,
                   help='and at least this many loop iterations (micro-batches) a process: '
                        'runs whose accumulation differs then warm up alike (default 0)')
    p.add_argument('--threads', type=int, default=1,
                   help="torch intra-op threads of every training process, plugin and "
                        "stock alike, set before its first step (default 1, torchrun's "
                        'default per rank)')
    p.add_argument('--out', default='work_dirs/benchmark_scaling', help='output folder')
    p.add_argument('--no-comm-run', dest='comm_run', action='store_false',
                   help='skip the second run per N with DDP communication disabled')
    p.add_argument('--repeats', type=int, default=1,
                   help='measure every process count this many times, in rounds of '
                        'alternating order; the table shows the median run and a second '
                        'table every round (default 1)')
    p.add_argument('--independent', action='store_true',
                   help='for each N > 1, also N single-GPU runs at once without a process '
                        'group: the no-communication ceiling on this machine')
    p.add_argument('--ddp-one', action='store_true',
                   help='also run the 1-process case as a DDP world of one (torchrun, '
                        'process group, DDP wrapper, SyncBN): the distributed code path\'s '
                        'cost without a second GPU')
    p.add_argument('--no-gpu-monitor', action='store_true',
                   help='do not add GPUMonitorHook (it all-gathers a few floats a report)')
    p.add_argument('--epoch-samples', type=int, default=None,
                   help='samples an epoch for time/epoch (default: the train dataset '
                        'length; 3712 x 2 for KITTI train with RepeatDataset x2)')
    p.add_argument('--profile-steps', type=int, default=0,
                   help='also run this many optimizer steps per GPU count under '
                   'torch.profiler: host syncs, collective time, top operators (0: off)')
    p.add_argument('--profile-traces', action='store_true',
                   help='with --profile-steps: write a Chrome trace per rank')
    p.add_argument('--compare-stock', default=None,
                   help="stock mmdet3d config ('mmdet3d::pv_rcnn/...py' or a path) run "
                        'without the plugin on the same data and effective batch')
    p.add_argument('--compare-nproc', type=int, default=1,
                   help='GPU count of the stock comparison run (default 1)')
    p.add_argument('--compare-stock-at', choices=('both', 'equal', 'shipped'),
                   default='both',
                   help="stock baseline settings: 'equal' = the plugin run's per-GPU batch, "
                        "accumulation, precision and loader workers; 'shipped' = the stock "
                        "config's own; 'both' (default) runs both, equal quoted first")
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override settings of the plugin config (key=value)')
    p.add_argument('--nnodes', type=int, default=1, help='nodes (multi-node form)')
    p.add_argument('--node-rank', type=int, default=0,
                   help='rank of this node (multi-node form; node 0 writes the results)')
    p.add_argument('--master-addr', default='127.0.0.1',
                   help='address of node 0 (multi-node form; default 127.0.0.1)')
    p.add_argument('--master-port', type=int, default=None,
                   help='rendezvous port (default: a free port; give one for '
                        'several nodes)')
    p.add_argument('--timeout', type=int, default=3600, help='seconds a run may take')
    # the flag of every long-running tool (mmdet3d_scaling.utils.progress), declared
    # here because importing the plugin before parsing would slow a usage error down
    p.add_argument('--no-progress', action='store_true',
                   help='no progress bars (runs done, iterations of the current run, '
                        'ETA); they go to stderr, and only when stderr is a terminal')
    args = p.parse_args(argv)
    for name, least in (('iters', 1), ('warmup', 0), ('warmup_iters', 0), ('threads', 1),
                        ('profile_steps', 0), ('repeats', 1)):
        if getattr(args, name) < least:
            p.error(f'--{name.replace("_", "-")} must be >= {least}, '
                    f'got {getattr(args, name)}')
    if args.independent and (args.nnodes > 1 or 1 not in args.nproc):
        p.error('--independent compares N single-GPU runs of one machine with its 1-GPU '
                f'run: it needs --nnodes 1 (got {args.nnodes}) and 1 in --nproc '
                f'(got {",".join(map(str, args.nproc))})')
    if args.ddp_one and (args.nnodes > 1 or 1 not in args.nproc):
        p.error('--ddp-one runs the 1-process case a second time as a DDP world of one: '
                f'it needs --nnodes 1 (got {args.nnodes}) and 1 in --nproc '
                f'(got {",".join(map(str, args.nproc))})')
    if args.nnodes > 1 and args.master_port is None:
        p.error('--nnodes > 1 needs --master-port (the same on every node)')
    return args


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Parse the arguments and run the benchmark; its result (``{}`` off node 0)."""
    args = parse_args(argv)
    # imported after parsing: the plugin's import takes seconds, a usage error should not
    from mmdet3d_scaling.utils import progress
    from mmdet3d_scaling.diagnostics.scaling_benchmark import run_benchmark
    progress.configure(args)
    return run_benchmark(args)


if __name__ == '__main__':
    main()
