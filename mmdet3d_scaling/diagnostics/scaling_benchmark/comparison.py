"""Stock mmdet3d against the plugin (``--compare-stock``): the stock config, without the
plugin, on the plugin config's dataset and at the plugin run's effective batch, reached
with the stock per-GPU batch and mmengine's ``accumulative_counts``."""
import argparse
import os
from typing import Any, Dict, List

from .launch import launch
from .summary import summarise


def stock_accumulation(total_batch: int, stock_batch: int, nproc: int) -> int:
    """Accumulation steps that give the stock per-GPU batch the plugin's effective batch."""
    if total_batch % (stock_batch * nproc):
        raise SystemExit(
            f'benchmark_scaling: the plugin run\'s effective batch {total_batch} is not a '
            f'multiple of the stock config\'s per-GPU batch {stock_batch} x {nproc} GPU(s); '
            'pick a --compare-nproc or a plugin total_batch_size that it divides.')
    return total_batch // (stock_batch * nproc)


def compare_stock(args: argparse.Namespace,
                  rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Stock mmdet3d on ``--compare-nproc`` GPUs: its own per-GPU batch, same total."""
    from mmengine.config import Config
    n = args.compare_nproc
    ref = next((r for r in rows if r['world_size'] == n), None)
    if ref is None:
        raise SystemExit(f'benchmark_scaling: --compare-nproc {n} must be one of --nproc '
                         f'{args.nproc} (the stock run matches that run\'s effective '
                         'batch).')
    path = resolve_stock(args.compare_stock)
    stock_batch = int(Config.fromfile(path, import_custom_modules=False)
                      .train_dataloader.batch_size)
    label = 'stock:' + os.path.splitext(os.path.basename(args.compare_stock))[0]
    work = os.path.join(args.out, f'stock_n{n}')
    spec = dict(config=path, data_from=os.path.abspath(args.config),
                data_cfg_options=args.cfg_options or {}, cfg_options={},
                warmup=args.warmup, warmup_iters=args.warmup_iters, iters=args.iters,
                plugin=False, label=label, comm='on',
                work_dir=work, result=os.path.join(work, 'result.json'),
                per_gpu_batch=stock_batch,
                accumulation=stock_accumulation(ref['total_batch'], stock_batch, n))
    raw = launch(spec, n, args)
    row = dict(summarise(raw, args.epoch_samples), label=label, config=args.compare_stock)
    row['speedup'] = row['samples_per_s'] / ref['samples_per_s']  # stock vs plugin
    ref['vs_stock'] = ref['samples_per_s'] / row['samples_per_s']
    row['efficiency'] = None
    return [row]


def resolve_stock(name: str) -> str:
    """A path, or ``mmdet3d::dir/file.py`` from the mmdet3d package's configs."""
    if name.startswith('mmdet3d::'):
        import mmdet3d
        path = os.path.join(os.path.dirname(mmdet3d.__file__), '.mim', 'configs',
                            name[len('mmdet3d::'):])
    else:
        path = os.path.abspath(name)
    if not os.path.exists(path):
        raise SystemExit(f'benchmark_scaling: stock config {name!r} not found ({path}); '
                         "give a path or 'mmdet3d::<dir>/<file>.py'.")
    return path
