"""A scaling benchmark from start to end: the timed runs of every process count (in
alternating rounds with ``--repeats``) and their comm-off twins, then the profile,
independent and DDP-world-of-one runs, the stock comparison, and the outputs.

The options are the parsed arguments of ``tools/benchmark_scaling.py`` (its
``--help`` lists them)."""
import argparse
import os
import sys
import time
from typing import Any, Dict, List, Optional

from .comparison import compare_stock
from .launch import launch, launch_independent
from .tracking import planned_runs, track
from .outputs import write_outputs
from .summary import (add_round_efficiency, add_scaling, median_row, summarise,
                      summarise_independent)

RESULT_VERSION = 1  # of scaling.json


def check_devices(args: argparse.Namespace) -> None:
    """Fail early when a CUDA benchmark asks for more GPUs than are visible."""
    if args.devices != 'cuda':
        return
    import torch
    have = torch.cuda.device_count()
    if max(args.nproc) > have:
        raise SystemExit(f'benchmark_scaling: --nproc {max(args.nproc)} needs as many '
                         f'GPUs, but {have} are visible; lower --nproc or use '
                         '--devices cpu (gloo) for a functional test.')


def measure(base: Dict[str, Any], label: str, n: int, args: argparse.Namespace,
            tag: str = '') -> Optional[Dict[str, Any]]:
    """One timed run at n processes (plus its comm-off twin): a table row, or None."""
    modes = ['on'] + (['off'] if args.comm_run and n * args.nnodes > 1 else [])
    measured: Dict[str, Dict[str, Any]] = {}
    for comm in modes:
        work = os.path.join(args.out, f'{label}_n{n}_comm-{comm}{tag}')
        spec = dict(base, label=label, comm=comm, work_dir=work,
                    result=os.path.join(work, 'result.json'))
        raw = launch(spec, n, args)
        if raw:
            measured[comm] = summarise(raw, args.epoch_samples)
    if not measured:
        return None
    row = dict(measured['on'], label=label, config=args.config)
    if 'off' in measured:
        row['comm_step_s'] = max(0.0, row['step_s'] - measured['off']['step_s'])
        row['no_comm_step_s'] = measured['off']['step_s']
        row['comm_share'] = row['comm_step_s'] / row['step_s']
    elif row['world_size'] == 1:
        row['comm_step_s'] = 0.0
    return row


def round_order(nproc: List[int], round_index: int) -> List[int]:
    """Process counts of one round: ascending, then descending (1,2 / 2,1 / 1,2 ...), so
    that a drift of the machine's speed during the rounds favours no count."""
    return list(nproc) if round_index % 2 == 0 else list(reversed(nproc))


def run_benchmark(args: argparse.Namespace) -> Dict[str, Any]:
    """Every run the options ask for, then the outputs under ``args.out``; the result
    written to ``scaling.json`` (``{}`` on a node other than 0, which writes nothing).
    A progress bar follows the runs (closed before the tables are printed)."""
    check_devices(args)
    os.makedirs(args.out, exist_ok=True)
    with track(planned_runs(args)):
        rows = make_runs(args)
    if rows is None:
        return {}
    result = dict(version=RESULT_VERSION, config=args.config, nproc=args.nproc,
                  nnodes=args.nnodes, devices=args.devices, warmup_steps=args.warmup,
                  warmup_iters=args.warmup_iters, intra_op_threads=args.threads,
                  repeats=args.repeats,
                  steps=args.iters, command=' '.join(sys.argv), rows=rows,
                  created=time.strftime('%Y-%m-%d %H:%M:%S'))
    write_outputs(result, args.out)
    return result


def make_runs(args: argparse.Namespace) -> Optional[List[Dict[str, Any]]]:
    """The runs, in order, and the table rows made of them (None off node 0)."""
    label = os.path.splitext(os.path.basename(args.config))[0]
    base = dict(config=os.path.abspath(args.config), cfg_options=args.cfg_options or {},
                warmup=args.warmup, warmup_iters=args.warmup_iters, iters=args.iters,
                intra_op_threads=args.threads, plugin=True,
                gpu_monitor=not args.no_gpu_monitor)
    runs: Dict[int, List[Dict[str, Any]]] = {}
    for r in range(args.repeats):
        tag = f'_r{r + 1}' if args.repeats > 1 else ''
        for n in round_order(args.nproc, r):
            row = measure(base, label, n, args, tag)
            if row is not None:
                runs.setdefault(n, []).append(row)
    rows: List[Dict[str, Any]] = []
    for n in args.nproc:  # profile / independent runs once, after the timed rounds
        if n not in runs:
            continue
        row = median_row(runs[n])
        if args.profile_steps:
            row['profile'] = profile_run(base, label, n, args)
        if args.independent and n > 1:
            row['independent_raw'] = launch_independent(base, label, n, args)
        if args.ddp_one and n == 1:
            one = ddp_one_run(base, label, args)
            row['ddp_one'] = dict(one, cost=1.0 - one['samples_per_s'] / row['samples_per_s'])
        rows.append(row)
    if args.node_rank != 0:
        return None
    add_scaling(rows)
    add_round_efficiency(rows)
    for row in rows:
        raws = row.pop('independent_raw', None)
        if raws:  # the CLI made sure a 1-process row exists
            one = next(r for r in rows if r['world_size'] == 1)
            row['independent'] = summarise_independent(raws, row['samples_per_s'],
                                                        one['samples_per_s'])
    if args.compare_stock:
        rows += compare_stock(args, rows)
    return rows


def profile_run(base: Dict[str, Any], label: str, n: int,
                args: argparse.Namespace) -> List[Dict[str, Any]]:
    """A separate run of ``--profile-steps`` steps under torch.profiler (profiling slows
    training, so its time is not used for the table); per-rank summaries."""
    work = os.path.join(args.out, f'{label}_n{n}_profile')
    spec = dict(base, label=label, comm='on', work_dir=work, iters=args.profile_steps,
                result=os.path.join(work, 'result.json'), profile=True,
                trace_dir=os.path.join(work, 'traces') if args.profile_traces else None)
    raw = launch(spec, n, args)
    return [dict(r['profile'], rank=r['rank']) for r in raw.get('ranks', [])
            if 'profile' in r]


def ddp_one_run(base: Dict[str, Any], label: str,
                args: argparse.Namespace) -> Dict[str, Any]:
    """One process through torchrun as a DDP world of one: process group, DDP wrapper
    and SyncBN conversion as in the N-GPU runs, but no second GPU to share the machine
    with or wait for."""
    work = os.path.join(args.out, f'{label}_n1_ddp-one')
    spec = dict(base, label=label, comm='on', work_dir=work, ddp_one=True,
                result=os.path.join(work, 'result.json'))
    return summarise(launch(spec, 1, args), args.epoch_samples)
