#!/usr/bin/env python
"""Count the host reads of one training step of a config, by Python call site.

Builds the config's Runner (plugin applied), trains ``--warmup`` steps, then counts what
``--steps`` more would read back from the GPU (``.item()``, ``if tensor:``, ``nonzero``,
boolean-mask indexing, ``.cpu()``:
:class:`mmdet3d_scaling.diagnostics.host_reads.HostReadCensus`).
Runs on a CPU: each such read is a point where a host-bound model's CPU waits for its
GPU, and in DDP with SyncBN where ranks wait for each other. Reads inside CUDA
extensions are not seen (see the module).

``--launches`` also counts, in the same steps, the operators that run a kernel (a launch
on a GPU; views excluded), with copies and dtype casts among them, by call site
(:class:`mmdet3d_scaling.diagnostics.launch_census.LaunchCensus`): the host-to-GPU
traffic a host-bound model's main thread issues, which is what a second process on the
machine slows down.

Usage::

    python tools/analysis/count_host_reads.py configs/pv_rcnn/pv_rcnn_synthetic_kitti_cpu.py
    python tools/analysis/count_host_reads.py CONFIG --steps 2 --top 30 --out reads.json
    python tools/analysis/count_host_reads.py CONFIG --steps 2 --launches
    python tools/analysis/count_host_reads.py GPU_CONFIG --steps 2 --launches --cuda-api

``--cuda-api`` (for a GPU): ``--steps`` further steps under ``torch.profiler``, without the
censuses, counting every CUDA runtime / driver call (kernel launches, copies, memsets,
synchronisations) by Python call site
(:func:`mmdet3d_scaling.diagnostics.profiling.driver_call_sites`), including those made
inside mmcv's and spconv's CUDA extensions, which the censuses cannot see; with the
steps' wall time and GPU kernel time (how host-bound the model is).
"""
import argparse
import os.path as osp
import sys
import time
from contextlib import ExitStack, nullcontext
from typing import Any, Dict

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import mmengine  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

import mmdet3d_scaling  # noqa: E402,F401
from mmdet3d_scaling.utils import progress  # noqa: E402
from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus  # noqa: E402
from mmdet3d_scaling.diagnostics.launch_census import LaunchCensus  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('config', help='training config file (plugin applied)')
    p.add_argument('--steps', type=int, default=1, help='counted training steps')
    p.add_argument('--warmup', type=int, default=1, help='training steps before counting')
    p.add_argument('--top', type=int, default=25, help='call sites listed')
    p.add_argument('--work-dir', default='work_dirs/count_host_reads',
                   help='work dir of the runner (default work_dirs/count_host_reads)')
    p.add_argument('--out', help='JSON output (default: WORK_DIR/host_reads.json)')
    p.add_argument('--launches', action='store_true',
                   help='also count kernel-running operators and copies by call site')
    p.add_argument('--cuda-api', action='store_true',
                   help='then profile --steps more steps: CUDA API calls by call site')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override config keys (key=value)')
    progress.add_argument(p)
    args = p.parse_args(argv)
    for name, least in (('steps', 1), ('warmup', 0), ('top', 1)):
        if getattr(args, name) < least:
            p.error(f'--{name} must be >= {least}, got {getattr(args, name)}')
    return args


def count(args) -> Dict[str, Any]:
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    cfg.work_dir = args.work_dir
    cfg.launcher = 'none'
    for key in ('val_dataloader', 'val_cfg', 'val_evaluator', 'test_dataloader',
                'test_cfg', 'test_evaluator'):
        cfg[key] = None
    runner = Runner.from_cfg(cfg)
    # a ScalingRunner applies the config's patches for its commands only: these steps
    # are driven here, so they run inside its scope
    with getattr(runner, 'in_scope', nullcontext)():
        return _count_steps(runner, args)


def _count_steps(runner, args) -> Dict[str, Any]:
    optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    batches = iter(runner.build_dataloader(runner._train_dataloader))
    model = runner.model
    model.train()
    # warm-up, counted and (--cuda-api) profiled steps: one bar (stderr, terminals only)
    bar = progress.bar(total=args.warmup + args.steps * (2 if args.cuda_api else 1),
                       desc='census steps', unit='step')
    bar.set_postfix_str('warm-up')
    for _ in range(args.warmup):
        model.train_step(next(batches), optim_wrapper)
        bar.update(1)
    census = HostReadCensus()
    launches = LaunchCensus() if args.launches else None
    samples, start = 0, time.perf_counter()
    bar.set_postfix_str('counting')
    for _ in range(args.steps):
        data = next(batches)
        samples += len(data['data_samples'])
        with ExitStack() as stack:
            stack.enter_context(census)
            if launches is not None:
                stack.enter_context(launches)
            model.train_step(data, optim_wrapper)
        bar.update(1)  # outside the censuses: the bar's own calls are not counted
    result = dict(config=args.config, steps=args.steps, samples=samples,
                  seconds=time.perf_counter() - start,
                  reads_per_step=census.total / args.steps,
                  reads_per_sample=census.total / max(samples, 1),
                  sites=census.sites(args.top, per=args.steps))
    if launches is not None:
        result.update(launches_per_step=launches.total / args.steps,
                      launches_per_sample=launches.total / max(samples, 1),
                      copies_per_step=launches.copies / args.steps,
                      launch_sites=launches.sites(args.top, per=args.steps))
    if args.cuda_api:
        bar.set_postfix_str('profiling')
        result['cuda_api'] = profile_cuda_api(model, batches, optim_wrapper, args,
                                              step_done=lambda: bar.update(1))
    bar.close()
    return result


def profile_cuda_api(model, batches, optim_wrapper, args,
                     step_done=None) -> Dict[str, Any]:
    """``args.steps`` training steps under torch.profiler: CUDA API calls by site;
    ``step_done()`` (the progress bar) after each."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from mmdet3d_scaling.diagnostics.profiling import (device_work_sites,
                                                       driver_call_sites,
                                                       summarize_profile)
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    data = [next(batches) for _ in range(args.steps)]  # loading stays outside
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=activities, with_stack=True) as prof:
        for batch in data:
            model.train_step(batch, optim_wrapper)
            if step_done is not None:
                step_done()
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    summary = summarize_profile(prof, args.steps, wall)
    calls = driver_call_sites(prof, args.steps, top=args.top)
    return dict(calls, device=('cuda' if cuda else 'cpu'),
                wall_ms_per_step=summary['wall_ms_per_iter'],
                kernel_ms_per_step=summary['device_kernel_ms_per_iter'],
                top_kernels=summary['top_device'],
                gpu_work=device_work_sites(prof, args.steps, top=args.top))


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    progress.configure(args)
    result = count(args)
    print(f"{result['reads_per_step']:.1f} host reads a training step "
          f"({result['reads_per_sample']:.1f} a sample), {args.steps} step(s) counted")
    print('per step | read | call site')
    for s in result['sites']:
        print(f"{s['count']:8.1f} | {s['op']} | {s['site']}")
    if 'launches_per_step' in result:
        print(f"\n{result['launches_per_step']:.0f} kernel-running operators a training "
              f"step ({result['launches_per_sample']:.0f} a sample), "
              f"{result['copies_per_step']:.0f} of them copies or dtype casts")
        print('per step | copies/casts | top operators | call site')
        for s in result['launch_sites']:
            ops = ', '.join(f'{op} {n:.0f}' for op, n in s['top_ops'].items())
            print(f"{s['count']:8.1f} | {s['copies']:6.1f} | {ops} | {s['site']}")
    if 'cuda_api' in result:
        api = result['cuda_api']
        print(f"\nprofiled ({api['device']}): {api['wall_ms_per_step']:.0f} ms wall, "
              f"{api['kernel_ms_per_step']:.0f} ms of GPU kernels a step (profiler on); "
              f"{api['calls_per_iter']:.0f} CUDA API calls a step: " + ', '.join(
                  f'{k} {v:.0f}' for k, v in api['by_call'].items()))
        for k in api['top_kernels']:
            print(f"  kernel {k['ms_per_iter']:7.1f} ms, {k['calls_per_iter']:6.0f} calls | "
                  f"{k['name'][:100]}")
        if not api['python_frames']:
            print("  (this torch's profiler recorded no Python frames: no call sites "
                  "below, only totals; --launches counts operators by site)")
        print('per step | calls | call site')
        for s in api['sites']:
            calls = ', '.join(f'{k} {v:.0f}' for k, v in s['by_call'].items())
            print(f"{s['calls_per_iter']:8.1f} | {calls} | {s['site']}")
        work = api['gpu_work']
        print(f"\n{work['work_per_iter']:.0f} GPU kernels / copies / memsets a step, "
              f"{100 * work['linked_share']:.0f} % linked to an operator's call site: "
              + ', '.join(f'{k} {v:.0f}' for k, v in work['linked_per_iter'].items()))
        print('per step | GPU work | call site')
        for s in work['sites']:
            kinds = ', '.join(f'{k} {v:.0f}' for k, v in s['by_kind'].items())
            print(f"{s['work_per_iter']:8.1f} | {kinds} | {s['site']}")
    out = args.out or osp.join(args.work_dir, 'host_reads.json')
    mmengine.dump(result, out, indent=2)  # creates the folder
    print(f'written: {out}')
    return result


if __name__ == '__main__':
    main()
