"""Stock mmdet3d against the plugin (``--compare-stock``): the stock config, without the
plugin, on the plugin config's dataset and at the plugin run's effective batch.

Two baselines (``--compare-stock-at``):

- ``equal`` (quoted first): the plugin run's per-GPU batch and accumulation, its
  precision settings (``float32_matmul_precision`` -> ``torch.set_float32_matmul_
  precision``, ``env_cfg.cudnn_benchmark``) and its loader workers. What differs is the
  plugin itself: its patches, wrapper and hooks.
- ``shipped``: the stock per-GPU batch (accumulation reaches the same effective batch),
  the stock config's precision settings and loader workers.

Warm-up, measured steps, torch's intra-op threads (``--threads``, default 1, set by the
worker before the first step of every run) and the data are the same in every run.
"""
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


MODES = ('equal', 'shipped')


def plugin_settings(config: str, cfg_options: Dict[str, Any]) -> Dict[str, Any]:
    """Precision and loader settings of the plugin config, for the equal baseline."""
    from mmengine.config import Config
    cfg = Config.fromfile(config, import_custom_modules=False)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return dict(float32_matmul_precision=cfg.get('float32_matmul_precision'),
                cudnn_benchmark=bool((cfg.get('env_cfg') or {}).get('cudnn_benchmark')),
                num_workers=cfg.train_dataloader.get('num_workers'))


def _stock_spec(args: argparse.Namespace, ref: Dict[str, Any], path: str, mode: str,
                stock_batch: int) -> Dict[str, Any]:
    n = args.compare_nproc
    label = f'stock@{mode}:' + os.path.splitext(os.path.basename(args.compare_stock))[0]
    work = os.path.join(args.out, f'stock_{mode}_n{n}')
    spec = dict(config=path, data_from=os.path.abspath(args.config),
                data_cfg_options=args.cfg_options or {}, cfg_options={},
                warmup=args.warmup, warmup_iters=args.warmup_iters, iters=args.iters,
                intra_op_threads=args.threads, plugin=False, label=label, comm='on',
                stock_settings=mode,
                work_dir=work, result=os.path.join(work, 'result.json'))
    if mode == 'equal':
        spec.update(per_gpu_batch=ref['per_gpu_batch'], accumulation=ref['accumulation'],
                    **plugin_settings(args.config, args.cfg_options or {}))
    else:
        spec.update(per_gpu_batch=stock_batch,
                    accumulation=stock_accumulation(ref['total_batch'], stock_batch, n))
    return spec


def compare_stock(args: argparse.Namespace,
                  rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Stock mmdet3d on ``--compare-nproc`` GPUs, at equal settings and as shipped."""
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
    modes = MODES if getattr(args, 'compare_stock_at', 'both') == 'both' else (
        args.compare_stock_at,)
    out = []
    for mode in modes:
        spec = _stock_spec(args, ref, path, mode, stock_batch)
        raw = launch(spec, n, args)
        row = dict(summarise(raw, args.epoch_samples), label=spec['label'],
                   config=args.compare_stock, stock_settings=mode)
        row['speedup'] = row['samples_per_s'] / ref['samples_per_s']  # stock vs plugin
        ref[f'vs_stock_{mode}'] = ref['samples_per_s'] / row['samples_per_s']
        if mode == modes[0]:
            ref['vs_stock'] = ref[f'vs_stock_{mode}']  # the first baseline is quoted
        row['efficiency'] = None
        out.append(row)
    return out


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
