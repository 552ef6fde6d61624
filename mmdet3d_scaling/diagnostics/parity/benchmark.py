"""One benchmark as a whole: prepared from the command line's values, run (reusing
finished runs, several at once with ``jobs``), reported as JSON after every run."""
import json
import os
import os.path as osp
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from .errors import ParityError, positive
from .launch import ROOT, RunSpec, build_runs, execute, finished_record
from .overrides import (COMMON_OVERRIDES, data_root_overrides, format_options,
                        schedule_overrides)
from .plan import Arrangement, config_total_batch, plan_arrangements, select
from .plots import plot_losses
from .summary import summarise


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
    bench.header['jobs'] = positive('--jobs', jobs)
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
