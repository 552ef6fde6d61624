"""The hang doctor on NCCL (2 GPUs): a rank asleep in its step, and a rank killed.

    python benchmarks/hang_doctor_nccl.py --out hang_doctor_nccl.json
    python benchmarks/hang_doctor_nccl.py --backend gloo --out x.json   # CPU smoke run

Runs tools/train.py under torchrun on 2 GPUs with the toy regressor (tests/toy.py) and
``distributed = dict(hang_timeout_s=20, timeout_minutes=10)``:

- ``asleep``: rank 1 sleeps inside its 3rd training step; expected: the report names
  rank 1 as behind (NCCL's flight recorder: fewest collectives issued), both stacks are
  logged, the job exits with code 75 within ~20 s + a heartbeat, not 10 min;
- ``killed``: two "nodes" (two torchrun launches, one GPU each); rank 1 kills itself
  with SIGKILL in its 3rd step, so node 1 is gone; NCCL does not see a dead peer by
  itself: expected: node 0 exits within ~20 s + a heartbeat, its doctor reporting no
  heartbeat from rank 1 (with gloo: the closed connection, named the same way).

Prints one line a case and writes seconds to exit, exit code and the checks to --out.
"""
import argparse
import json
import os
import os.path as osp
import socket
import subprocess
import sys
import tempfile
import time

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.engine.sleepy_toy import sleepy_config  # noqa: E402  (the run's config)
# sleep_s < 0: SleepyToyRegressor kills its process instead (a dead peer)
KILL_PATCH = '''
import os, signal, time
from tests.engine import sleepy_toy
_sleep = time.sleep
def _die_or_sleep(seconds):
    if seconds < 0:
        os.kill(os.getpid(), signal.SIGKILL)
    _sleep(seconds)
sleepy_toy.time = type('T', (), dict(sleep=staticmethod(_die_or_sleep)))
'''


def run_case(name: str, sleep_s: float, work: str, backend: str) -> dict:
    config = osp.join(work, f'{name}.py')
    with open(config, 'w') as f:
        f.write(sleepy_config(backend, hang_timeout_s=20, timeout_minutes=10, sleep_s=sleep_s,
                              imports=('hang_doctor_kill',) if sleep_s < 0 else ()))
    with open(osp.join(work, 'hang_doctor_kill.py'), 'w') as f:
        f.write(KILL_PATCH)
    env = dict(os.environ, PYTHONPATH=f'{REPO}:{work}', OMP_NUM_THREADS='1')
    if backend == 'gloo':
        env['CUDA_VISIBLE_DEVICES'] = ''
    train = [osp.join(REPO, 'tools', 'train.py'), config, '--launcher', 'pytorch',
             '--work-dir', osp.join(work, name)]
    start = time.monotonic()
    if sleep_s >= 0:  # one node, 2 processes
        proc = subprocess.run(
            [sys.executable, '-m', 'torch.distributed.run', '--standalone',
             '--nproc_per_node=2', *train],
            cwd=work, env=env, capture_output=True, text=True, timeout=900)
        log = proc.stdout + proc.stderr
    else:  # two "nodes" of one process each: node 1 dies, node 0 is measured
        with socket.socket() as s:
            s.bind(('127.0.0.1', 0))
            port = s.getsockname()[1]
        nodes = [subprocess.Popen(
            [sys.executable, '-m', 'torch.distributed.run', '--nnodes=2',
             f'--node_rank={rank}', '--master_addr=127.0.0.1', f'--master_port={port}',
             '--nproc_per_node=1', *train],
            cwd=work, env=dict(env, CUDA_VISIBLE_DEVICES=str(rank)) if backend == 'nccl'
            else env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in range(2)]
        log = nodes[0].communicate(timeout=900)[0]
        nodes[1].communicate(timeout=900)
        proc = nodes[0]
    checks = dict(
        named_rank_1=('rank(s) behind: 1' in log or 'rank(s) 1 sent no heartbeat' in log
                      or 'rank(s) 1 stopped sending heartbeats' in log),
        flight_recorder=('fewest collectives issued' in log),
        stack_rank_0='Python stack of rank 0' in log)
    result = dict(case=name, seconds_to_exit=round(time.monotonic() - start, 1),
                  returncode=proc.returncode, **checks)
    with open(osp.join(work, f'{name}.log'), 'w') as f:
        f.write(log)
    result['log'] = osp.join(work, f'{name}.log')
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', required=True, help='JSON file for the results')
    parser.add_argument('--backend', default='nccl',
                        help="'nccl' (default; 2 GPUs) or 'gloo' (CPU smoke run)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix='hang_doctor_nccl_')
    results = [run_case('asleep', 600.0, work, args.backend),
               run_case('killed', -1.0, work, args.backend)]
    for r in results:
        print(f"{r['case']}: exit code {r['returncode']} after {r['seconds_to_exit']} s "
              f"(start-up included); rank 1 named: {r['named_rank_1']}; flight recorder: "
              f"{r['flight_recorder']}; rank 0 stack: {r['stack_rank_0']}; log {r['log']}")
    with open(args.out, 'w') as f:
        json.dump(results, f, indent=2)


if __name__ == '__main__':
    main()
