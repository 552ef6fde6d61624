"""BEVFusion camera loading: JPEG decoding in the loader workers (PIL, ``decode='cpu'``)
vs on the model's device (``decode='gpu'``), on real JPEG files.

Builds the real train dataloader of a BEVFusion LiDAR-camera config (the plugin's
pipeline, ``--workers`` loader processes) over synthetic nuScenes-format data written
by ``tools/create_synthetic_data.py nuscenes --full-res`` (six 1600 x 900 JPEGs per
sample, quality 92), and for each decode mode and worker count measures, per batch:

- ``wait_s``: how long the main loop waits on the loader for the next batch;
- ``preprocess_s``: the data preprocessor (CUDA-synchronised): host-to-device copy and
  normalisation, plus for ``gpu`` the batched decode and the augmentation;
- ``decode_augment_s``: the ``gpu`` mode's decode + augment part of it;
- ``loader_samples_per_s``: batch size / (wait + preprocess), the loading path alone;
- with ``--model-step``: ``step_s`` (forward, backward, optimizer step of the config's
  model) and ``train_samples_per_s`` = batch size / (wait + preprocess + step).

``--compare K`` also decodes K samples both ways with the same augmentation draws and
reports how far the device images are from the PIL ones (levels of 0-255) and whether
every ``img_aug_matrix`` is identical. On a machine without CUDA, ``gpu`` mode runs on
the CPU device (labelled ``device: cpu``). Prints the figures and writes JSON::

    python tools/create_synthetic_data.py nuscenes --out data/nuscenes \\
        --train-frames 48 --val-frames 2 --full-res --workers 8
    python benchmarks/camera_decoding.py --data-root data/nuscenes --workers 2,4,8 \\
        --iters 20 --model-step --out camera_decoding.json
"""
import argparse
import json
import os
import os.path as osp
import platform
import statistics
import sys
import time
from typing import Dict, List, Optional

import numpy as np
import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import mmdet3d_scaling  # noqa: E402,F401  (registers the plugin, applies patches)
from mmengine.config import Config  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from mmdet3d.registry import DATASETS, MODELS  # noqa: E402
from mmdet3d_scaling.models.bevfusion.bevfusion import BEVFusion  # noqa: E402

CONFIG = 'configs/bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_6e_nus-3d.py'
LOADER = 'BEVLoadMultiViewImageFromFiles'


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _innermost(dataset_cfg: Config) -> Config:
    while 'dataset' in dataset_cfg:  # CBGSDataset and other wrappers
        dataset_cfg = dataset_cfg.dataset
    return dataset_cfg


def build_config(path: str, data_root: str, decode: str, workers: int,
                 batch_size: Optional[int]) -> Config:
    """The config with data under ``data_root``, ``decode`` on the image loader."""
    cfg = Config.fromfile(path)
    root = data_root.rstrip('/') + '/'
    dataset = _innermost(cfg.train_dataloader.dataset)
    dataset.data_root = root
    loaders = [t for t in dataset.pipeline if t['type'] == LOADER]
    if not loaders:
        raise SystemExit(f'{path}: no {LOADER} in the train pipeline; pick a '
                         'LiDAR-camera BEVFusion config.')
    for step in dataset.pipeline:
        if step['type'] == LOADER:
            step['decode'] = decode
        if step['type'] == 'ObjectSample':
            step['db_sampler']['data_root'] = root
            step['db_sampler']['info_path'] = root + 'nuscenes_dbinfos_train.pkl'
    # no epoch end inside the measurement
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
    cfg.train_dataloader.num_workers = workers
    cfg.train_dataloader.persistent_workers = workers > 0
    if batch_size:
        cfg.train_dataloader.batch_size = batch_size
    cfg.model.setdefault('img_backbone', {})['init_cfg'] = None  # no download
    return cfg


def _timed_decode(pre, device: torch.device, sink: List[float]) -> None:
    """Record the time of each ``decode_deferred`` call (CUDA-synchronised)."""
    inner = pre.decode_deferred

    def timed(packets):
        _sync(device)
        start = time.perf_counter()
        out = inner(packets)
        _sync(device)
        sink.append(time.perf_counter() - start)
        return out

    pre.decode_deferred = timed


def _stats(values: List[float]) -> Dict[str, float]:
    if not values:
        return {}
    return dict(mean=statistics.fmean(values), median=statistics.median(values),
                p90=float(np.percentile(values, 90)), max=max(values))


def run_mode(args, decode: str, workers: int, device: torch.device) -> Dict:
    """One decode mode at one worker count: per-batch timings."""
    cfg = build_config(args.config, args.data_root, decode, workers, args.batch_size)
    loader = Runner.build_dataloader(cfg.train_dataloader, seed=0)
    model = optim = None
    if args.model_step:
        model = MODELS.build(cfg.model).to(device).train()
        pre = model.data_preprocessor
        optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        pre_cfg, _ = BEVFusion._split_voxelize_cfg(cfg.model.data_preprocessor)
        pre = MODELS.build(pre_cfg).to(device)
    decode_times: List[float] = []
    _timed_decode(pre, device, decode_times)
    batch = cfg.train_dataloader.batch_size
    waits, pres, steps = [], [], []
    it = iter(loader)
    start = time.perf_counter()
    for i in range(args.warmup + args.iters):
        t0 = time.perf_counter()
        data = next(it)
        t1 = time.perf_counter()
        data = pre(data, True)
        _sync(device)
        t2 = time.perf_counter()
        if model is not None:
            losses = model(**data, mode='loss')
            loss, _ = model.parse_losses(losses)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            _sync(device)
        t3 = time.perf_counter()
        if i == 0:
            first = t1 - start
        if i >= args.warmup:
            waits.append(t1 - t0)
            pres.append(t2 - t1)
            steps.append(t3 - t2)
    decode_times = decode_times[args.warmup:]
    out = dict(decode=decode, workers=workers, batch_size=batch, iters=args.iters,
               first_batch_s=first, wait_s=_stats(waits), preprocess_s=_stats(pres),
               loader_samples_per_s=batch / statistics.fmean(
                   [w + p for w, p in zip(waits, pres)]))
    if decode == 'gpu':
        out['decoder'] = pre._backend()
        out['decode_augment_s'] = _stats(decode_times)
    if model is not None:
        out['step_s'] = _stats(steps)
        out['train_samples_per_s'] = batch / statistics.fmean(
            [w + p + s for w, p, s in zip(waits, pres, steps)])
    del loader, it, model, optim
    if device.type == 'cuda':
        out['peak_mem_gib'] = torch.cuda.max_memory_allocated(device) / 2 ** 30
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return out


def compare(args, device: torch.device) -> Dict:
    """Device decode + augment vs the PIL path on ``args.compare`` samples."""
    results = {}
    for decode in ('cpu', 'gpu'):
        cfg = build_config(args.config, args.data_root, decode, 0, None)
        dataset_cfg = _innermost(cfg.train_dataloader.dataset)
        keep = [t for t in dataset_cfg.pipeline
                if t['type'] in (LOADER, 'ImageAug3D')]
        dataset_cfg.pipeline = keep
        dataset_cfg.test_mode = True  # no packing, no skipping of empty frames
        dataset = DATASETS.build(dataset_cfg)
        outs = []
        for i in range(args.compare):
            np.random.seed(i)  # the same augmentation draws in both modes
            outs.append(dataset[i])
        results[decode] = outs
    pre_cfg, _ = BEVFusion._split_voxelize_cfg(cfg.model.data_preprocessor)
    pre = MODELS.build(pre_cfg).to(device)
    diffs, same_matrix = [], True
    for ref, deferred in zip(results['cpu'], results['gpu']):
        same_matrix &= all(np.array_equal(a, b) for a, b in
                           zip(ref['img_aug_matrix'], deferred['img_aug_matrix']))
        packet = torch.from_numpy(deferred['img']).permute(2, 0, 1)
        got = pre.decode_deferred([packet])[0].permute(0, 2, 3, 1).cpu().numpy()
        diffs.append(np.abs(got - np.stack(ref['img'])).ravel())
    diff = np.concatenate(diffs)
    return dict(samples=args.compare, decoder=pre._backend(), device=str(device),
                img_aug_matrix_identical=bool(same_matrix), max_abs=float(diff.max()),
                p99_9_abs=float(np.percentile(diff, 99.9)), mean_abs=float(diff.mean()),
                share_differing=float((diff > 0).mean()))


def _line(r: Dict) -> str:
    text = (f"decode={r['decode']:<3} workers={r['workers']} batch={r['batch_size']}: "
            f"wait {r['wait_s']['mean'] * 1e3:7.1f} ms, preprocess "
            f"{r['preprocess_s']['mean'] * 1e3:6.1f} ms")
    if 'decode_augment_s' in r:
        text += f" (decode+augment {r['decode_augment_s']['mean'] * 1e3:.1f} ms)"
    text += f", loading {r['loader_samples_per_s']:.2f} samples/s"
    if 'step_s' in r:
        text += (f", step {r['step_s']['mean'] * 1e3:.0f} ms, train "
                 f"{r['train_samples_per_s']:.2f} samples/s")
    return text


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--config', default=CONFIG,
                        help='BEVFusion LiDAR-camera config (default: %(default)s)')
    parser.add_argument('--data-root', default='data/nuscenes',
                        help='synthetic nuScenes root with full-res JPEGs')
    parser.add_argument('--workers', default='4',
                        help='loader processes, comma-separated list (default 4)')
    parser.add_argument('--modes', default='cpu,gpu', help='decode modes to run')
    parser.add_argument('--batch-size', type=int, default=None,
                        help="samples per batch (default: the config's)")
    parser.add_argument('--iters', type=int, default=20, help='measured batches')
    parser.add_argument('--warmup', type=int, default=3,
                        help='batches run before measuring (worker start-up included)')
    parser.add_argument('--model-step', action='store_true',
                        help="also run the config's model: forward, backward, AdamW")
    parser.add_argument('--compare', type=int, default=2,
                        help='samples decoded both ways to measure the image '
                        'difference (0: off)')
    parser.add_argument('--device', default=None,
                        help='cuda or cpu (default: cuda where available)')
    parser.add_argument('--out', default=None, help='JSON file to write (a new file)')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing --out file')
    args = parser.parse_args(argv)
    if args.out and osp.exists(args.out) and not args.overwrite:
        parser.error(f'--out {args.out!r} exists: pick a new file, or pass --overwrite '
                     'to replace it')  # before the minutes of measuring
    if not osp.isfile(osp.join(args.data_root, 'nuscenes_infos_train.pkl')):
        raise SystemExit(f'{args.data_root}: no nuscenes_infos_train.pkl; write the data '
                         'with tools/create_synthetic_data.py nuscenes --full-res.')
    init_default_scope('mmdet3d')
    device = torch.device(args.device or ('cuda' if torch.cuda.is_available() else 'cpu'))
    if args.model_step and device.type != 'cuda':
        print('note: --model-step on the CPU runs the full model; expect minutes a step')
    report = dict(
        command=' '.join([osp.basename(sys.argv[0])] + (argv or sys.argv[1:])),
        config=args.config, data_root=args.data_root, device=str(device),
        device_name=(torch.cuda.get_device_name(device) if device.type == 'cuda'
                     else platform.processor() or 'cpu'),
        cpu_count=os.cpu_count(), torch=torch.__version__, runs=[])
    try:
        import torchvision
        report['torchvision'] = torchvision.__version__
    except Exception as exc:  # noqa: BLE001  (absent, or built for another torch)
        report['torchvision'] = f'unavailable ({type(exc).__name__})'
    if args.compare:
        report['compare'] = compare(args, device)
        c = report['compare']
        print(f"images, device ({c['decoder']} on {c['device']}) vs PIL path, "
              f"{c['samples']} samples: max {c['max_abs']:.0f}, p99.9 "
              f"{c['p99_9_abs']:.0f}, mean {c['mean_abs']:.4f} levels; "
              f"{c['share_differing'] * 100:.3f}% of values differ; img_aug_matrix "
              f"identical: {c['img_aug_matrix_identical']}")
    for workers in [int(w) for w in args.workers.split(',')]:
        for decode in args.modes.split(','):
            result = run_mode(args, decode, workers, device)
            report['runs'].append(result)
            print(_line(result), flush=True)
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(report, f, indent=1)
        print('wrote', args.out)


if __name__ == '__main__':
    main()
