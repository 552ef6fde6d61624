"""Launch: one run's commands (``tools/train.py`` or ``tools/dist_train.sh``, then
``tools/test.py``), their execution as subprocesses and the run's saved record."""
import json
import os
import os.path as osp
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .errors import ParityError
from .logs import headline_metrics, last_checkpoint, loss_per_step, read_test_metrics
from .overrides import format_options
from .plan import Arrangement

#: the repository (tools/ lives there); this file is mmdet3d_scaling/diagnostics/parity/
ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
RESULT_FILE = 'parity_run.json'


@dataclass
class RunSpec:
    """One training + evaluation run.

    Args:
        arrangement: how the batch is split.
        seed: ``--seed`` of tools/train.py.
        work_dir: training work dir; the evaluation writes to ``work_dir/test``.
        options: every ``--cfg-options`` of training (arrangement, schedule, logging,
            data root, user options).
        test_options: ``--cfg-options`` of tools/test.py (data root, user options).
    """
    arrangement: Arrangement
    seed: int
    work_dir: str
    options: Dict[str, Any]
    test_options: Dict[str, Any]
    config: str = ''

    def train_cmd(self, python: str = sys.executable) -> List[str]:
        tools = osp.join(ROOT, 'tools')
        args = ['--work-dir', self.work_dir, '--seed', str(self.seed),
                '--cfg-options', *format_options(self.options)]
        if self.arrangement.nproc == 1:
            return [python, osp.join(tools, 'train.py'), self.config, *args]
        return ['bash', osp.join(tools, 'dist_train.sh'), self.config,
                str(self.arrangement.nproc), *args]

    def test_cmd(self, checkpoint: str, python: str = sys.executable) -> List[str]:
        cmd = [python, osp.join(ROOT, 'tools', 'test.py'), self.config, checkpoint,
               '--work-dir', osp.join(self.work_dir, 'test')]
        return cmd + (['--cfg-options', *format_options(self.test_options)]
                      if self.test_options else [])


def build_runs(config: str, arrangements: Sequence[Arrangement], seeds: Sequence[int],
               out: str, common: Dict[str, Any],
               test_common: Dict[str, Any]) -> List[RunSpec]:
    """Runs seed by seed (every arrangement for a seed before the next seed), so an
    interrupted benchmark still has each arrangement with the same seeds."""
    if len(set(seeds)) != len(seeds):
        raise ParityError(f'--seeds has repeated values: {list(seeds)}')
    runs = []
    for seed in seeds:
        for arr in arrangements:
            options = {**common, **arr.overrides()}
            runs.append(RunSpec(arr, seed, osp.join(out, 'runs', arr.name, f'seed{seed}'),
                                options, dict(test_common), config=config))
    return runs


def _env(python: str) -> Dict[str, str]:
    env = dict(os.environ)
    env['PYTHON'] = python  # dist_train.sh's interpreter
    env['PYTHONPATH'] = ROOT + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH')
                                else '')
    env.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # see docs/demo.md: shared small CPUs
    return env


def _run(cmd: List[str], log: str, env: Dict[str, str]) -> Tuple[int, float]:
    start = time.perf_counter()
    with open(log, 'w') as f:
        f.write(shlex.join(cmd) + '\n')
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    return proc.returncode, time.perf_counter() - start


def _tail(path: str, lines: int = 15) -> str:
    with open(path, errors='replace') as f:
        return ''.join(f.readlines()[-lines:])


def execute(spec: RunSpec, python: str = sys.executable, jobs: int = 1) -> Dict[str, Any]:
    """Train and evaluate one run; its record (also saved as ``work_dir/parity_run.json``).

    A failed step is recorded with its exit status and the log's last lines, not raised:
    the other runs still go on. ``jobs`` (runs sharing the machine) is recorded beside
    the wall times.
    """
    os.makedirs(spec.work_dir, exist_ok=True)
    env = _env(python)
    record = dict(arrangement=spec.arrangement.name, seed=spec.seed,
                  work_dir=spec.work_dir, cfg_options=format_options(spec.options),
                  train_cmd=shlex.join(spec.train_cmd(python)), runs_at_once=jobs)
    code, train_s = _run(spec.train_cmd(python), osp.join(spec.work_dir, 'train.out'), env)
    record['train_wall_s'] = round(train_s, 1)
    if code:
        return _failed(record, 'train', code, osp.join(spec.work_dir, 'train.out'))
    ckpt = last_checkpoint(spec.work_dir)
    test_log = osp.join(spec.work_dir, 'test.out')
    record['test_cmd'] = shlex.join(spec.test_cmd(ckpt, python))
    code, test_s = _run(spec.test_cmd(ckpt, python), test_log, env)
    record['test_wall_s'] = round(test_s, 1)
    if code:
        return _failed(record, 'test', code, test_log)
    metrics = read_test_metrics(osp.join(spec.work_dir, 'test'))
    record.update(status='ok', metrics=headline_metrics(metrics), all_metrics=metrics,
                  loss_curve=loss_per_step(spec.work_dir, spec.arrangement.accumulation))
    _save(record, spec.work_dir)
    return record


def _failed(record: Dict[str, Any], step: str, code: int, log: str) -> Dict[str, Any]:
    record.update(status=f'{step} failed (exit {code})', log_tail=_tail(log))
    _save(record, record['work_dir'])
    return record


def _save(record: Dict[str, Any], work_dir: str) -> None:
    with open(osp.join(work_dir, RESULT_FILE), 'w') as f:
        json.dump(record, f, indent=1)


def finished_record(spec: RunSpec) -> Optional[Dict[str, Any]]:
    """The saved record of an earlier identical run that succeeded, else None."""
    path = osp.join(spec.work_dir, RESULT_FILE)
    if not osp.isfile(path):
        return None
    with open(path) as f:
        record = json.load(f)
    same = record.get('cfg_options') == format_options(spec.options)
    return record if same and record.get('status') == 'ok' else None
