"""Starting benchmark runs: one run in fresh processes, or N independent ones at once.

Each run is :mod:`.worker` started as a script (plain for one process, under
``torchrun`` otherwise) with a spec JSON in its work dir; rank 0 writes ``result.json``
there and :func:`read_result` takes it only when every rank's figures are in it.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...utils import progress
from . import tracking

HERE = os.path.dirname(os.path.abspath(__file__))
# the folder holding mmdet3d_scaling: on the workers' PYTHONPATH for the plugin import
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
# a script, not ``-m``: a stock run's process must not import the plugin (see worker.py)
WORKER = os.path.join(HERE, 'worker.py')


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(('', 0))
        return s.getsockname()[1]


def prepare_run(spec: Dict[str, Any], nproc: int,
                 args: argparse.Namespace) -> Tuple[List[str], Dict[str, str]]:
    """Write the run's spec (dropping a stale result); the worker command and its env."""
    os.makedirs(spec['work_dir'], exist_ok=True)
    spec.setdefault('progress', tracking.progress_path(spec['work_dir']))
    spec_path = os.path.join(spec['work_dir'], 'spec.json')
    with open(spec_path, 'w') as f:
        json.dump(spec, f, indent=1)
    for stale in (spec['result'], spec.get('progress')):
        if stale and os.path.exists(stale):
            os.remove(stale)  # a stale result must not pass for this run's
    env = dict(os.environ)
    env['PYTHONPATH'] = ROOT + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH')
                                else '')
    if args.devices == 'cpu':
        env['CUDA_VISIBLE_DEVICES'] = ''
        env.setdefault('OMP_NUM_THREADS', str(max(1, (os.cpu_count() or 1) // nproc)))
    return [sys.executable, WORKER, spec_path], env


def launch(spec: Dict[str, Any], nproc: int, args: argparse.Namespace) -> Dict[str, Any]:
    """One training run in fresh processes; returns rank 0's result JSON."""
    me, env = prepare_run(spec, nproc, args)
    if nproc == 1 and args.nnodes == 1 and not spec.get('ddp_one'):
        cmd = me
    else:
        port = args.master_port or free_port()
        cmd = [sys.executable, '-m', 'torch.distributed.run', f'--nnodes={args.nnodes}',
               f'--node_rank={args.node_rank}', f'--master_addr={args.master_addr}',
               f'--master_port={port}', f'--nproc_per_node={nproc}'] + me[1:]
    log_path = os.path.join(spec['work_dir'], 'run.log')
    progress.echo(f'[benchmark_scaling] {spec["label"]}: {nproc} process(es) x '
                  f'{args.nnodes} node(s), comm {spec["comm"]} ... (log: {log_path})')
    tracker = tracking.active()
    tracker.start_run(f'n{nproc} comm-{spec["comm"]}', [spec['progress']])
    try:
        with open(log_path, 'w') as log:
            proc = run_watched(cmd, env, log, args.timeout, tracker.poll)
    finally:
        tracker.finish_run()
    result = read_result(spec['result'], nproc * args.nnodes)
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-4000:]
        if result is None:
            raise RuntimeError(f'benchmark run failed (exit {proc.returncode}): '
                               f'{" ".join(cmd)}\n--- last lines of {log_path} ---\n'
                               f'{tail}')
        # Training finished and every rank reported; a process died while exiting.
        progress.echo(f'[benchmark_scaling] WARNING: {spec["label"]} ({nproc} '
                      f'process(es)) exited with code {proc.returncode} after all ranks '
                      f'had written their figures; they are used, the exit is recorded '
                      f'as exit_code (log: {log_path}).')
        result['exit_code'] = proc.returncode
    if args.node_rank != 0:
        return {}
    if result is None:
        raise RuntimeError(f'benchmark run wrote no complete result: {spec["result"]} '
                           f'(log: {log_path})')
    return result


def run_watched(cmd: List[str], env: Dict[str, str], log: Any, timeout_s: float,
                tick: Callable[[], None]) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, timeout=timeout_s)`` with output to ``log`` that calls
    ``tick`` (the progress bar) while it waits; past the time limit the process is
    killed and ``subprocess.TimeoutExpired`` raised, as ``subprocess.run`` does."""
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                proc.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(cmd, timeout_s) from None
                tick()
    finally:
        if proc.poll() is None:  # time limit, or interrupted (Ctrl-C)
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode)


def visible_gpus(n: int) -> List[str]:
    """CUDA_VISIBLE_DEVICES values for n single-GPU processes (honours an existing list)."""
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    ids = [v for v in visible.split(',') if v.strip()] if visible else \
        [str(i) for i in range(n)]
    if len(ids) < n:
        raise SystemExit(f'benchmark_scaling: --independent with {n} runs needs {n} GPUs, '
                         f'CUDA_VISIBLE_DEVICES={visible!r} lists {len(ids)}.')
    return ids[:n]


def launch_independent(base: Dict[str, Any], label: str, n: int,
                        args: argparse.Namespace) -> List[Dict[str, Any]]:
    """n single-process runs at once, one GPU each, no process group; their results."""
    gpus = visible_gpus(n) if args.devices == 'cuda' else [''] * n
    procs = []
    barrier = os.path.join(args.out, f'{label}_n{n}_independent', 'start_barrier')
    shutil.rmtree(barrier, ignore_errors=True)  # a stale run's files must not count
    for i, gpu in enumerate(gpus):
        work = os.path.join(args.out, f'{label}_n{n}_independent', f'run{i}')
        spec = dict(base, label=label, comm='on', work_dir=work,
                    result=os.path.join(work, 'result.json'),
                    start_barrier=dict(directory=barrier, count=n, timeout_s=args.timeout))
        cmd, env = prepare_run(spec, n, args)
        if args.devices == 'cuda':
            env['CUDA_VISIBLE_DEVICES'] = gpu
            # the threads torchrun gives each of N ranks: only the process group differs
            env.setdefault('OMP_NUM_THREADS', '1')
        for key in ('WORLD_SIZE', 'RANK', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
            env.pop(key, None)
        log = open(os.path.join(work, 'run.log'), 'w')
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT),
                      log, spec, work))
    progress.echo(f'[benchmark_scaling] {label}: {n} independent single-GPU runs at '
                  'once ...')
    tracker = tracking.active()
    tracker.start_run(f'{n} independent', [spec['progress'] for _, _, spec, _ in procs])
    try:
        wait_together([p for p, *_ in procs], args.timeout, tick=tracker.poll)
    finally:
        tracker.finish_run()
        for _, log, _, _ in procs:
            log.close()
    raws = [read_result(spec['result'], 1) for _, _, spec, _ in procs]
    # report the run that failed by itself, not one stopped because of it
    failed = sorted((proc.returncode == -signal.SIGTERM, i)
                    for i, (proc, *_) in enumerate(procs) if raws[i] is None)
    if failed:
        proc, _, _, work = procs[failed[0][1]]
        with open(os.path.join(work, 'run.log')) as f:
            tail = f.read()[-4000:]
        raise RuntimeError(f'independent run failed (exit {proc.returncode}), log '
                           f'{work}/run.log:\n{tail}')
    return raws


def wait_together(procs: List[subprocess.Popen], timeout_s: float,
                  tick: Optional[Callable[[], None]] = None) -> None:
    """Wait for runs that meet at a start barrier: when one fails, stop the others
    (they would wait at the barrier until its time limit); past ``timeout_s`` stop all.
    ``tick`` (the progress bar) is called while waiting."""
    deadline = time.monotonic() + timeout_s
    while True:
        # poll every run: any() would stop at the first live one and miss a failed peer
        codes = [p.poll() for p in procs]
        if None not in codes:
            return
        failed = any(code not in (None, 0) for code in codes)
        if failed or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            return
        if tick is not None:
            tick()
        time.sleep(0.5)


def read_result(path: str, world_size: int) -> Optional[Dict[str, Any]]:
    """Rank 0's result JSON if it exists and holds every rank's figures."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        result = json.load(f)
    return result if len(result.get('ranks', [])) == world_size else None

