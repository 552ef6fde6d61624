"""Does the recipe reproduce? One config, several arrangements of one effective batch.

The ``scaling`` recipe promises that one config keeps its recipe (effective batch, LR,
schedule in optimizer steps) on 1..N processes. This module checks it end to end: it
trains the config in several *arrangements* of the same effective batch ``T = B x K``,
each with several seeds, through the repository's ``tools/train.py`` (``torchrun`` via
``tools/dist_train.sh`` for several processes) and evaluates every run with
``tools/test.py``:

- ``1proc_bB_accK``: 1 process, micro-batch B, K accumulation steps (the reference);
- ``1proc_bT``: 1 process, batch T at once, no accumulation;
- ``Nproc_bB_acc{K/N}``: N processes (gloo on a CPU, NCCL on GPUs), micro-batch B,
  K/N accumulation steps;
- ``stock`` (optional): the config as written, without ``scaling`` overrides.

Every recipe arrangement keeps ``scaling.total_batch_size = T`` and sets
``scaling.per_gpu_batch_size`` / ``max_per_gpu_batch_size``; the recipe derives the
accumulation and converts LR and iteration counts. The result is one JSON (every run's
overrides, seed, metrics, loss per optimizer step, wall time, and the per-arrangement
mean / std / min / max) and a loss-curve overlay PNG.

Loss curves are read from mmengine's ``vis_data/scalars.json`` with the logger set to
every loop iteration; a point is the mean loss over one optimizer step's micro-batches
*of rank 0* (mmengine logs rank 0's losses only), so an N-process curve averages 1/N of
each step's samples and is noisier, not biased.
"""
import json
import os
import os.path as osp
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
KITTI_CLASSES = ('Car', 'Pedestrian', 'Cyclist')
#: scheduler fields that count iterations (scaled when ``iters`` shortens the run)
STEP_FIELDS = ('begin', 'end', 'T_max', 'step_size', 'milestones', 'total_steps')
RESULT_FILE = 'parity_run.json'


class ParityError(ValueError):
    """A combination of arrangement settings that cannot be trained as asked."""


# ----------------------------------------------------------------------- arrangements
@dataclass
class Arrangement:
    """One way to train the effective batch.

    Args:
        name: label in the outputs, e.g. ``1proc_b2_acc4``.
        nproc: processes (GPUs).
        per_gpu_batch: samples per process per forward/backward (micro-batch).
        accumulation: micro-batches per optimizer step and process.
        stock: the config as written (no ``scaling`` overrides).
    """
    name: str
    nproc: int
    per_gpu_batch: int
    accumulation: int
    stock: bool = False

    @property
    def total_batch(self) -> int:
        return self.nproc * self.per_gpu_batch * self.accumulation

    def overrides(self) -> Dict[str, Any]:
        """``--cfg-options`` that select this arrangement through the recipe."""
        if self.stock:
            return {}
        return {'scaling.total_batch_size': self.total_batch,
                'scaling.per_gpu_batch_size': self.per_gpu_batch,
                'scaling.max_per_gpu_batch_size': self.per_gpu_batch}


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ParityError(f'{name} must be a positive integer, got {value!r}')
    return value


def plan_arrangements(total_batch: int, batch: int, accumulation: int,
                      nprocs: Sequence[int] = (2,), stock: bool = False,
                      stock_batch: Optional[int] = None,
                      stock_accumulation: int = 1) -> List[Arrangement]:
    """The arrangements of ``total_batch = batch x accumulation``.

    Args:
        total_batch: samples per optimizer step (the config's ``scaling.total_batch_size``).
        batch: micro-batch B of the 1-process reference.
        accumulation: accumulation K of the reference (>= 2, else the reference and the
            no-accumulation arrangement are the same run).
        nprocs: process counts > 1 to add, each ``Nproc_bB_acc{K/N}``.
        stock: also the config as written.
        stock_batch: the config's own per-process batch (for the stock label).
        stock_accumulation: the config's own accumulation (for the stock loss curve).

    Raises:
        ParityError: the numbers do not fit together; the message names them and what
            would.
    """
    total = _positive('total batch', total_batch)
    b = _positive('--batch', batch)
    k = _positive('--accumulation', accumulation)
    if b * k != total:
        raise ParityError(
            f'--batch {b} x --accumulation {k} = {b * k}, but the effective batch '
            f'(scaling.total_batch_size) is {total}: pick B and K with B x K = {total}, '
            f'e.g. {_factor_pairs(total)}.')
    if k < 2:
        raise ParityError(
            f'--accumulation {k}: the reference 1proc_b{b}_acc1 and the no-accumulation '
            f'arrangement 1proc_b{total} are the same run; use K >= 2 '
            f'(e.g. {_factor_pairs(total)}).')
    plan = [Arrangement(f'1proc_b{b}_acc{k}', 1, b, k),
            Arrangement(f'1proc_b{total}', 1, total, 1)]
    for n in sorted(set(nprocs)):
        n = _positive('process count', n)
        if n == 1:
            raise ParityError('process count 1 is always run (the 1-process '
                              'arrangements); --nproc lists the counts > 1 to add.')
        if k % n:
            raise ParityError(
                f'--accumulation {k} cannot be split over {n} processes (micro-batch {b} '
                f'kept): K must be a multiple of every process count; with {n} processes '
                f'use K in {[m for m in range(n, 4 * n + 1, n)]} (and B = {total} / K), '
                f'or drop {n} from --nproc.')
        plan.append(Arrangement(f'{n}proc_b{b}_acc{k // n}', n, b, k // n))
    if stock:
        sb = stock_batch or 0
        plan.append(Arrangement('stock', 1, sb, stock_accumulation, stock=True))
    return plan


def select(arrangements: Sequence[Arrangement], names: Sequence[str]) -> List[Arrangement]:
    """The arrangements named in ``names``, in planned order.

    Raises:
        ParityError: a name is not among the planned arrangements.
    """
    known = [a.name for a in arrangements]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ParityError(f'--only {",".join(unknown)}: no such arrangement for these '
                          f'settings; planned: {", ".join(known)}')
    return [a for a in arrangements if a.name in names]


def _factor_pairs(total: int) -> str:
    pairs = [f'{d} x {total // d}' for d in range(1, total) if total % d == 0]
    return ', '.join(pairs) or f'{total} has no split with K >= 2'


def config_total_batch(cfg: Any) -> Tuple[int, str]:
    """The config's effective batch and where it comes from."""
    scaling = cfg.get('scaling') or {}
    if scaling.get('total_batch_size'):
        return int(scaling['total_batch_size']), 'scaling.total_batch_size'
    batch = int(cfg.train_dataloader.batch_size)
    acc = int((cfg.get('optim_wrapper') or {}).get('accumulative_counts') or 1)
    return batch * acc, (f'train_dataloader.batch_size={batch} x accumulation {acc} '
                         '(the config has no scaling key)')


# -------------------------------------------------------------------- config overrides
def schedule_overrides(cfg: Any, iters: int) -> Dict[str, Any]:
    """``--cfg-options`` that shorten an iteration-based schedule to ``iters`` steps.

    Scheduler ``begin``/``end``/``T_max``/... of ``by_epoch=False`` schedulers are
    scaled by ``iters / max_iters`` (the schedule keeps its shape), checkpoints and
    validation land on the last step.

    Raises:
        ParityError: the config's loop is not iteration-based.
    """
    iters = _positive('--iters', iters)
    train_cfg = cfg.get('train_cfg') or {}
    old = train_cfg.get('max_iters')
    if not old:
        raise ParityError(
            f'--iters needs an iteration-based config (train_cfg.max_iters); this one '
            f'has train_cfg={dict(train_cfg)!r}. Leave --iters out to train its own '
            'schedule.')
    out: Dict[str, Any] = {'train_cfg.max_iters': iters}
    if 'val_interval' in train_cfg:
        out['train_cfg.val_interval'] = iters
    ckpt = (cfg.get('default_hooks') or {}).get('checkpoint') or {}
    if ckpt.get('by_epoch') is False:
        out['default_hooks.checkpoint.interval'] = iters
    scheds = cfg.get('param_scheduler') or []
    scheds = [scheds] if isinstance(scheds, dict) else scheds
    for i, sched in enumerate(scheds):
        if sched.get('by_epoch', True) is not False:
            continue
        for name in STEP_FIELDS:
            if name in sched:
                out[f'param_scheduler.{i}.{name}'] = _rescale(sched[name], iters / old)
    return out


def _rescale(value: Any, factor: float) -> Any:
    if isinstance(value, (list, tuple)):
        return [_rescale(v, factor) for v in value]
    if isinstance(value, bool) or not isinstance(value, int) or value >= 2**31:
        return value
    return 0 if value == 0 else max(1, int(round(value * factor)))


def data_root_overrides(cfg: Any, data_root: str) -> Dict[str, Any]:
    """``--cfg-options`` moving every path under ``cfg.data_root`` to ``data_root``.

    ``data_root`` is interpolated into the dataset, sampler and evaluator paths when the
    config is parsed, so overriding ``data_root`` alone changes nothing else.
    """
    old = cfg.get('data_root')
    if not old:
        raise ParityError('--data-root needs a config with a data_root key')
    new = data_root.rstrip('/') + '/'
    out: Dict[str, Any] = {'data_root': new}
    for path, value in _walk(cfg.to_dict() if hasattr(cfg, 'to_dict') else cfg, ''):
        if isinstance(value, str) and value.startswith(old) and path != 'data_root':
            out[path] = new + value[len(old):]
    return out


def _walk(node: Any, prefix: str) -> Iterable[Tuple[str, Any]]:
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, (list, tuple)):
        items = enumerate(node)
    else:
        yield prefix, node
        return
    for key, sub in items:
        yield from _walk(sub, f'{prefix}.{key}' if prefix else str(key))


#: every loop iteration logged with its own loss (the loss curve), no validation during
#: training (tools/test.py evaluates the last checkpoint)
COMMON_OVERRIDES = {'default_hooks.logger.interval': 1, 'log_processor.window_size': 1,
                    'val_cfg': None, 'val_dataloader': None, 'val_evaluator': None}


def format_options(options: Dict[str, Any]) -> List[str]:
    """``--cfg-options`` arguments (``key=value``) that DictAction parses back."""
    return [f'{k}={_format_value(v)}' for k, v in options.items()]


def _format_value(value: Any) -> str:
    if value is None:
        return 'None'
    if isinstance(value, (list, tuple)):
        return '[' + ','.join(_format_value(v) for v in value) + ']'
    return str(value)


# ------------------------------------------------------------------------------- runs
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


# ------------------------------------------------------------------------ log reading
def last_checkpoint(work_dir: str) -> str:
    """The checkpoint mmengine's CheckpointHook saved last in ``work_dir``."""
    path = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(path):
        raise FileNotFoundError(f'{work_dir} has no last_checkpoint file: the training '
                                'run saved no checkpoint (see train.out there)')
    with open(path) as f:
        return f.read().strip()


def _timestamp_dirs(work_dir: str) -> List[str]:
    """mmengine's per-run log folders (named by timestamp) in ``work_dir``, newest last."""
    if not osp.isdir(work_dir):
        return []
    return sorted(osp.join(work_dir, d) for d in os.listdir(work_dir)
                  if osp.isfile(osp.join(work_dir, d, f'{d}.log')))


def read_test_metrics(test_dir: str) -> Dict[str, float]:
    """Metrics of the newest ``tools/test.py`` run in ``test_dir`` (its ``<ts>.json``)."""
    for log_dir in reversed(_timestamp_dirs(test_dir)):
        path = osp.join(log_dir, osp.basename(log_dir) + '.json')
        if osp.isfile(path):
            with open(path) as f:
                lines = [json.loads(line) for line in f if line.strip()]
            return {k: float(v) for k, v in lines[-1].items()
                    if isinstance(v, (int, float))}
    raise FileNotFoundError(f'no test metrics JSON (<timestamp>/<timestamp>.json) under '
                            f'{test_dir}: did tools/test.py finish? (see test.out)')


def headline_metrics(metrics: Dict[str, float]) -> Dict[str, float]:
    """KITTI AP40 moderate (3D, BEV; overall and per class at the strict IoU) or
    nuScenes mAP / NDS, under short names.

    Raises:
        ParityError: neither kind of metric is among ``metrics``.
    """
    out: Dict[str, float] = {}
    for key, value in metrics.items():
        name = key.rsplit('/', 1)[-1]
        if '/KITTI/' in key:
            for kind in ('3D', 'BEV'):
                if name == f'Overall_{kind}_AP40_moderate':
                    out[f'{kind}_AP40_moderate'] = value
                for cls in KITTI_CLASSES:
                    if name == f'{cls}_{kind}_AP40_moderate_strict':
                        out[f'{cls}_{kind}_AP40_moderate'] = value
        elif name in ('mAP', 'NDS'):
            out[name] = value
    if not out:
        raise ParityError('no KITTI AP40 moderate or nuScenes mAP/NDS among the test '
                          f'metrics: {sorted(metrics)[:12]}')
    return out


def loss_per_step(work_dir: str, accumulation: int) -> List[float]:
    """Mean logged loss per optimizer step (rank 0's micro-batches of each step).

    Reads ``vis_data/scalars.json`` of the newest training log folder; the logger must
    have run every iteration (``default_hooks.logger.interval=1``).
    """
    acc = _positive('accumulation', accumulation)
    losses: Dict[int, float] = {}
    for log_dir in _timestamp_dirs(work_dir):
        path = osp.join(log_dir, 'vis_data', 'scalars.json')
        if not osp.isfile(path):
            continue
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if 'loss' in rec and 'iter' in rec:
                    losses[int(rec['iter'])] = float(rec['loss'])
    steps: Dict[int, List[float]] = {}
    for it, loss in sorted(losses.items()):
        steps.setdefault((it - 1) // acc, []).append(loss)
    return [round(statistics.fmean(v), 6) for _, v in sorted(steps.items())]


# --------------------------------------------------------------------------- summary
def describe(values: Sequence[float]) -> Dict[str, float]:
    """n, mean, sample std (0 for one value), min, max and spread (max - min)."""
    if not values:
        raise ParityError('no values to summarise')
    vals = [float(v) for v in values]
    return dict(n=len(vals), mean=statistics.fmean(vals),
                std=statistics.stdev(vals) if len(vals) > 1 else 0.0,
                min=min(vals), max=max(vals), spread=max(vals) - min(vals))


def summarise(records: Sequence[Dict[str, Any]],
              arrangements: Sequence[Arrangement]) -> Dict[str, Any]:
    """Per arrangement: seeds done, each headline metric described, mean wall times, and
    the difference of the means to the reference (the first arrangement) with whether
    the two seed ranges overlap."""
    out: Dict[str, Any] = {}
    for arr in arrangements:
        done = [r for r in records if r['arrangement'] == arr.name
                and r.get('status') == 'ok']
        failed = [r for r in records if r['arrangement'] == arr.name
                  and r.get('status') != 'ok']
        entry: Dict[str, Any] = dict(seeds=[r['seed'] for r in done],
                                     failed_seeds=[r['seed'] for r in failed])
        if done:
            names = sorted(set.intersection(*(set(r['metrics']) for r in done)))
            entry['metrics'] = {m: describe([r['metrics'][m] for r in done])
                                for m in names}
            entry['train_wall_s'] = statistics.fmean(r['train_wall_s'] for r in done)
            entry['test_wall_s'] = statistics.fmean(r['test_wall_s'] for r in done)
        out[arr.name] = entry
    _compare_to_reference(out, arrangements[0].name)
    return out


def _compare_to_reference(summary: Dict[str, Any], reference: str) -> None:
    ref = summary.get(reference, {}).get('metrics')
    if not ref:
        return
    for name, entry in summary.items():
        if name == reference or 'metrics' not in entry:
            continue
        entry['vs_reference'] = {
            m: dict(delta_mean=d['mean'] - ref[m]['mean'],
                    ranges_overlap=d['min'] <= ref[m]['max'] and ref[m]['min'] <= d['max'])
            for m, d in entry['metrics'].items() if m in ref}


#: table columns per benchmark kind, the first whose metrics a summary holds
TABLE_METRICS = (('3D_AP40_moderate', 'BEV_AP40_moderate'), ('mAP', 'NDS'))


def table_metrics(summary: Dict[str, Any]) -> Sequence[str]:
    """The headline columns for ``summary``: KITTI AP40 moderate or nuScenes mAP / NDS."""
    held = {m for entry in summary.values() for m in entry.get('metrics', {})}
    for columns in TABLE_METRICS:
        if held & set(columns):
            return columns
    return TABLE_METRICS[0]


def markdown_table(summary: Dict[str, Any],
                   metrics: Optional[Sequence[str]] = None) -> str:
    """The docs table: arrangement, seeds, mean +- std [min, max] per metric, wall.
    ``metrics`` default: :func:`table_metrics`."""
    if metrics is None:
        metrics = table_metrics(summary)
    head = ['arrangement', 'seeds'] + [m.replace('_', ' ') for m in metrics] + [
        'train wall (s)', 'test wall (s)']
    rows = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for name, entry in summary.items():
        cells = [f'`{name}`', ', '.join(map(str, entry['seeds'])) or '-']
        for m in metrics:
            d = entry.get('metrics', {}).get(m)
            cells.append(f"{d['mean']:.2f} ± {d['std']:.2f} [{d['min']:.2f}, "
                         f"{d['max']:.2f}]" if d else '-')
        cells += [f"{entry[k]:.0f}" if k in entry else '-'
                  for k in ('train_wall_s', 'test_wall_s')]
        rows.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(rows)


def plot_losses(records: Sequence[Dict[str, Any]], arrangements: Sequence[Arrangement],
                path: str, title: str = '') -> None:
    """Mean loss per optimizer step per arrangement, a band from the seeds' min to max."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5))
    for arr in arrangements:
        curves = [r['loss_curve'] for r in records
                  if r['arrangement'] == arr.name and r.get('loss_curve')]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        cols = [[c[i] for c in curves] for i in range(length)]
        steps = list(range(1, length + 1))
        mean = [statistics.fmean(c) for c in cols]
        line, = ax.plot(steps, mean, lw=1.2, label=f'{arr.name} ({len(curves)} seeds)')
        ax.fill_between(steps, [min(c) for c in cols], [max(c) for c in cols],
                        color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xlabel('optimizer step')
    ax.set_ylabel('training loss (mean over the step\'s micro-batches, rank 0)')
    ax.set_yscale('log')
    ax.set_title(title or 'loss per optimizer step: mean over seeds, band = seed min..max')
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(path: str, header: Dict[str, Any], records: Sequence[Dict[str, Any]],
                 arrangements: Sequence[Arrangement]) -> Dict[str, Any]:
    """The JSON: header (config, command, iterations, batch), arrangements, every run
    and the summary. Written after each run, so an interrupted benchmark keeps its
    finished runs."""
    report = dict(header, arrangements=[dict(asdict(a), total_batch=a.total_batch,
                                             cfg_options=format_options(a.overrides()))
                                        for a in arrangements],
                  runs=list(records), summary=summarise(records, arrangements))
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, path)
    return report


@dataclass
class Benchmark:
    """Everything one benchmark needs, built from the command line by
    :func:`prepare`.

    Args:
        runs: the runs, seed by seed.
        arrangements: the arrangements, the reference first.
        header: what the JSON records about the benchmark as a whole.
    """
    runs: List[RunSpec]
    arrangements: List[Arrangement]
    header: Dict[str, Any] = field(default_factory=dict)


def prepare(config: str, out: str, batch: int, accumulation: int,
            seeds: Sequence[int], nprocs: Sequence[int] = (2,),
            iters: Optional[int] = None, stock: bool = False,
            data_root: Optional[str] = None,
            cfg_options: Optional[Dict[str, Any]] = None,
            only: Optional[Sequence[str]] = None) -> Benchmark:
    """Load the config, plan the arrangements and the runs (nothing is started).

    ``only`` keeps the named arrangements (their order as planned).
    """
    from mmengine.config import Config
    if not osp.isfile(config):
        raise ParityError(f'config file {config!r} does not exist')
    if len(seeds) < 1:
        raise ParityError('--seeds needs at least one seed')
    cfg = Config.fromfile(config)
    user = dict(cfg_options or {})
    if user:
        cfg.merge_from_dict(user)
    total, source = config_total_batch(cfg)
    own_batch = int(cfg.train_dataloader.batch_size)
    own_acc = int((cfg.get('optim_wrapper') or {}).get('accumulative_counts') or 1)
    arrangements = plan_arrangements(total, batch, accumulation, nprocs, stock,
                                     stock_batch=own_batch, stock_accumulation=own_acc)
    if only:
        arrangements = select(arrangements, only)
    data = data_root_overrides(cfg, data_root) if data_root else {}
    # training drops validation: no paths into the val_* keys it sets to None
    train_data = {k: v for k, v in data.items()
                  if k.split('.', 1)[0] not in COMMON_OVERRIDES}
    common = {**COMMON_OVERRIDES, **(schedule_overrides(cfg, iters) if iters else {}),
              **train_data, **user}
    runs = build_runs(osp.abspath(config), arrangements, list(seeds), out, common,
                      {**data, **user})
    header = dict(config=config, total_batch=total, total_batch_from=source,
                  iters=iters or cfg.train_cfg.get('max_iters'), seeds=list(seeds),
                  data_root=data_root or cfg.get('data_root'),
                  user_cfg_options=format_options(user),
                  command=shlex.join([osp.relpath(sys.argv[0], ROOT)
                                      if sys.argv[0].startswith(ROOT) else sys.argv[0],
                                      *sys.argv[1:]]))
    return Benchmark(runs, arrangements, header)


def run_benchmark(bench: Benchmark, out: str, python: str = sys.executable,
                  log=print, jobs: int = 1) -> Dict[str, Any]:
    """Run every run (reusing finished identical ones), rewriting the JSON and PNG after
    each; the final report.

    ``jobs`` runs start at once (each its own processes; torchrun picks a free port per
    multi-process run). They share the machine: on one large GPU this fits several
    1-process runs into one session, but their wall times are then not a speed figure.
    The report lists the runs in plan order whatever order they finish in.
    """
    bench.header['jobs'] = _positive('--jobs', jobs)
    json_path, png_path = osp.join(out, 'parity.json'), osp.join(out, 'parity.png')
    done: Dict[int, Dict[str, Any]] = {}
    report: Dict[str, Any] = {}
    total = len(bench.runs)

    def tag(i: int) -> str:
        spec = bench.runs[i]
        return f'[parity] run {i + 1}/{total}: {spec.arrangement.name} seed {spec.seed}'

    def finish(i: int, record: Dict[str, Any]) -> None:
        nonlocal report
        done[i] = record
        log(f'{tag(i)}: {record["status"]}, {_brief(record)}')
        records = [done[k] for k in sorted(done)]
        report = write_report(json_path, bench.header, records, bench.arrangements)
        plot_losses(records, bench.arrangements, png_path,
                    title=f'{osp.basename(bench.header["config"])}: '
                          f'{bench.header["iters"]} optimizer steps of '
                          f'{bench.header["total_batch"]} samples')

    todo = []
    for i, spec in enumerate(bench.runs):
        record = finished_record(spec)
        if record is not None:
            log(f'{tag(i)}: reusing the finished run in {spec.work_dir}')
            finish(i, record)
        else:
            todo.append(i)
    if jobs == 1:
        for i in todo:
            log(f'{tag(i)}: training in {bench.runs[i].work_dir}')
            finish(i, execute(bench.runs[i], python))
        return report
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {}
        for i in todo:  # the pool starts them in plan order as slots free up
            log(f'{tag(i)}: queued, work dir {bench.runs[i].work_dir}')
            futures[pool.submit(execute, bench.runs[i], python, jobs)] = i
        for future in as_completed(futures):
            finish(futures[future], future.result())
    return report


def _brief(record: Dict[str, Any]) -> str:
    metrics = record.get('metrics') or {}
    shown = ', '.join(f'{k} {v:.2f}' for k, v in metrics.items()
                      if k in ('3D_AP40_moderate', 'BEV_AP40_moderate', 'mAP', 'NDS'))
    return (f'{shown}; ' if shown else '') + (
        f'train {record.get("train_wall_s", "-")} s, test {record.get("test_wall_s", "-")} s')


def dry_run_lines(bench: Benchmark, python: str = sys.executable) -> List[str]:
    """The commands each run would execute (the checkpoint is read from the work dir's
    ``last_checkpoint`` after training)."""
    lines = []
    for spec in bench.runs:
        ckpt = f'$(cat {shlex.quote(osp.join(spec.work_dir, "last_checkpoint"))})'
        lines.append(f'# {spec.arrangement.name}, seed {spec.seed}')
        lines.append(shlex.join(spec.train_cmd(python)))
        test = shlex.join(spec.test_cmd('CKPT', python)).replace('CKPT', ckpt, 1)
        lines.append(test)
    return lines
