"""Samples/s of a training run as users start it: a train script, a config, its log.

Runs ``python TRAIN CONFIG`` (this repository's ``tools/train.py``, or mmdet3d's own
``tools/train.py`` for a stock or ``projects/`` config) in a process of its own, on a
wrapper config that changes only how long it runs and what it logs:

- ``IterBasedTrainLoop`` for ``--iters`` iterations, no validation (mmengine's loop
  validates after its last iteration unless ``val_begin`` lies beyond), no checkpoint;
- the logger every ``--log-interval`` iterations (default 1) with a window of as many,
  so that mmengine's ``vis_data/scalars.json`` holds each window's mean ``time`` (from
  the end of one iteration to the end of the next: data loading included) and
  ``memory`` (mmengine's peak allocated MiB since the previous log). An interval above
  one measures a run as configs log it: with ``async_logging`` every logged iteration
  reads its values (a wait for the GPU), the others do not.

A ``ScalingRunner`` config counts ``max_iters`` in optimizer steps (its recipe may
accumulate several micro-batches a step): pass ``--iters`` as steps there; the summary
reads the iterations the log holds either way.

Samples/s = micro-batch x measured iterations / their summed time, iterations after the
first ``--warmup``; peak memory = the largest ``memory`` of those iterations (the warm-up's
autotune workspaces excluded). One JSON result per run::

    python benchmarks/train_speed.py --label ours_bf16 --batch 4 --out r.json \
        --config configs/bevfusion/...py --cfg-options amp.dtype=bfloat16
    python benchmarks/train_speed.py --label upstream_amp --batch 4 --out u.json \
        --train /path/to/mmdet3d/tools/train.py --cwd /path/to/mmdetection3d \
        --config projects/BEVFusion/configs/...py --amp

``--from-log LOG`` summarises a run's own ``train_speed.log`` instead of starting one
(a run stopped after its last iteration, before this script wrote its JSON): the same
records from the log's text, whose times mmengine rounds to 4 decimals.

``--cwd`` runs from another tree (mmdet3d's ``projects/`` import from its root, which
then goes on ``PYTHONPATH``); ``--env K=V`` sets variables of the run (e.g.
``PYTHONPATH`` without spconv).
"""
import argparse
import glob
import json
import os
import os.path as osp
import re
import statistics
import subprocess
import sys
import time
from typing import Dict, List

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))

WRAPPER = '''_base_ = [{base!r}]
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={iters},
                 val_begin={never}, val_interval={never})
default_hooks = dict(logger=dict(type='LoggerHook', interval={log}),
                     checkpoint=dict(type='CheckpointHook', interval={never},
                                     save_last=False))
log_processor = dict(window_size={log})
'''


def write_wrapper(config: str, iters: int, work_dir: str, log: int = 1) -> str:
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(work_dir, 'train_speed_config.py')
    with open(path, 'w') as f:
        f.write(WRAPPER.format(base=osp.abspath(config), iters=iters, never=10 ** 8,
                               log=log))
    return path


def read_scalars(work_dir: str) -> List[Dict]:
    """The per-iteration records of the run's newest ``vis_data/scalars.json``."""
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not files:
        raise SystemExit(f'train_speed: no */vis_data/scalars.json under {work_dir}: the '
                         'run logged no iteration (see its log in the same folder)')
    with open(files[-1]) as f:
        return [json.loads(line) for line in f if '"time"' in line]


#: mmengine's text log line of a training iteration: its counter and the scalars
_LOG_ITER = re.compile(r'(?:Iter\(train\) \[(\d+)/\d+\]|Epoch\(train\) +\[(\d+)\]\[(\d+)/(\d+)\])')
_LOG_VALUE = re.compile(r'\b(time|data_time|memory): ([0-9.]+)')


def read_log_records(path: str) -> List[Dict]:
    """The per-iteration records of an mmengine text log (global iteration as ``step``)."""
    records = []
    with open(path, errors='replace') as f:
        for line in f:
            match = _LOG_ITER.search(line)
            if not match or 'time: ' not in line:
                continue
            if match.group(1):
                step = int(match.group(1))
            else:
                epoch, inner, length = (int(g) for g in match.group(2, 3, 4))
                step = (epoch - 1) * length + inner
            values = {k: float(v) for k, v in _LOG_VALUE.findall(line)}
            records.append(dict(step=step, **values))
    if not records:
        raise SystemExit(f'train_speed: {path} holds no training iteration line')
    return records


def summarise(records: List[Dict], batch: int, warmup: int, log: int = 1) -> Dict:
    """Each record is the mean of ``log`` iterations (its window), all after warm-up
    (``warmup`` a multiple of ``log``): samples/s = batch x records / summed means."""
    measured = [r for r in records if r.get('step', r.get('iter', 0)) > warmup]
    if len(measured) < 3:
        raise SystemExit(f'train_speed: only {len(measured)} iterations after the '
                         f'{warmup} of warm-up; raise --iters')
    times = [r['time'] for r in measured]
    data = [r.get('data_time', 0.0) for r in measured]
    memory = [r['memory'] for r in measured if 'memory' in r]
    return dict(iterations=len(times) * log, log_interval=log, samples_per_s=round(batch * len(times) / sum(times), 3),
                iter_s_median=round(statistics.median(times), 4),
                data_time_share=round(sum(data) / sum(times), 4),
                peak_allocated_mib=max(memory) if memory else None)


def report(args: argparse.Namespace, records: List[Dict], **extra) -> None:
    """Write and print the run's JSON result: what ran, ``extra``, the summary."""
    result = dict(label=args.label, config=args.config, train=args.train, amp=args.amp,
                  cfg_options=args.cfg_options, env=args.env, batch=args.batch,
                  warmup=args.warmup, **extra,
                  **summarise(records, args.batch, args.warmup, args.log_interval))
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--label', required=True)
    parser.add_argument('--config', required=True)
    parser.add_argument('--train', default=osp.join(REPO, 'tools', 'train.py'))
    parser.add_argument('--cwd', default=REPO)
    parser.add_argument('--batch', type=int, required=True,
                        help='micro-batch of the run (samples an iteration)')
    parser.add_argument('--iters', type=int, default=40)
    parser.add_argument('--warmup', type=int, default=12)
    parser.add_argument('--amp', action='store_true', help="the train script's --amp")
    parser.add_argument('--cfg-options', nargs='*', default=[])
    parser.add_argument('--env', action='append', default=[],
                        help='K=V for the run (repeatable)')
    parser.add_argument('--log-interval', type=int, default=1,
                        help='iterations a log line (and a window); --warmup a multiple')
    parser.add_argument('--work-dir')
    parser.add_argument('--out', required=True)
    parser.add_argument('--from-log', metavar='LOG',
                        help="summarise this run's train_speed.log instead of running")
    args = parser.parse_args()
    work_dir = osp.abspath(args.work_dir or osp.join(REPO, 'work_dirs', 'train_speed',
                                                     args.label))
    config = osp.join(args.cwd, args.config) if not osp.isabs(args.config) else args.config
    if args.log_interval < 1 or args.warmup % args.log_interval:
        parser.error(f'--log-interval {args.log_interval}: a positive divisor of --warmup '
                     f'{args.warmup} (each log line must cover measured iterations only)')
    if args.from_log:
        return report(args, read_log_records(args.from_log),
                      source=f'log: {osp.basename(args.from_log)}')
    wrapper = write_wrapper(config, args.iters, work_dir, args.log_interval)
    cmd = [sys.executable, args.train, wrapper, '--work-dir', work_dir]
    if args.amp:
        cmd.append('--amp')
    if args.cfg_options:
        cmd += ['--cfg-options', *args.cfg_options]
    env = dict(os.environ)
    env.update(kv.split('=', 1) for kv in args.env)
    log = osp.join(work_dir, 'train_speed.log')
    start = time.time()
    with open(log, 'w') as f:
        rc = subprocess.run(cmd, cwd=args.cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.time() - start
    if rc:
        with open(log) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f'train_speed {args.label}: rc {rc}\n{tail}')
    report(args, read_scalars(work_dir), wall_s=round(wall, 1))


if __name__ == '__main__':
    main()
