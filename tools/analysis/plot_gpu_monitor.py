#!/usr/bin/env python
"""Plot GPUMonitorHook figures from a run's JSON scalar log into PNG files.

mmengine's LocalVisBackend writes one JSON object a line to
``<work_dir>/<timestamp>/vis_data/<timestamp>.json`` (and ``scalars.json`` beside it),
keyed by the log tag (``gpu_mem_peak_mb``, ... or ``train/gpu_...`` with
``log_with_hierarchy``) plus ``step`` (the training iteration).

Usage:
    python tools/analysis/plot_gpu_monitor.py WORK_DIR_OR_LOG [--out-dir DIR]

``WORK_DIR_OR_LOG`` may be the JSON file, its ``vis_data`` folder, a run's timestamp
folder, or the work dir (its newest run is used).
"""
import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

KEY_PREFIX = 'gpu_'
# (file name, title, y label, series) for plain line plots.
LINE_PLOTS = (
    ('memory.png', 'GPU memory', 'MiB',
     ('mem_alloc_mb', 'mem_reserved_mb', 'mem_peak_mb', 'nvml_mem_used_mb')),
    ('utilisation.png', 'GPU utilisation (NVML)', '%', ('util_pct',)),
    ('power.png', 'GPU power (NVML)', 'W', ('power_w',)),
    ('temperature.png', 'GPU temperature (NVML)', '°C', ('temp_c',)),
    ('data_wait.png', 'Share of iteration time waiting for data', 'share',
     ('data_wait_share',)),
    ('throughput.png', 'Training throughput', 'samples/s',
     ('samples_per_s', 'samples_per_s_global')),
)
ACROSS_RANK_KEYS = ('samples_per_s', 'data_wait_share', 'mem_peak_mb', 'util_pct')


class NoMonitorData(ValueError):
    """The log holds no GPUMonitorHook keys."""


def find_log(path: Path) -> Path:
    """Resolve a JSON log, vis_data folder, run folder or work dir to one JSON file."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f'{path} does not exist: pass a run\'s work dir or its '
                                'vis_data/<timestamp>.json.')
    if path.name == 'vis_data':
        named = sorted(p for p in path.glob('*.json') if p.name != 'scalars.json')
        if named:
            return named[-1]
        if (path / 'scalars.json').is_file():
            return path / 'scalars.json'
    elif (path / 'vis_data').is_dir():
        return find_log(path / 'vis_data')
    else:
        runs = sorted(p.parent for p in path.glob('*/vis_data'))
        if runs:
            return find_log(runs[-1])
    raise FileNotFoundError(f'No JSON scalar log under {path}: expected '
                            '<work_dir>/<timestamp>/vis_data/<timestamp>.json (written by '
                            'LocalVisBackend).')


def load_monitor_records(log: Path) -> List[Dict[str, float]]:
    """The log lines that carry GPUMonitorHook keys, keys without ``train/gpu_``."""
    records = []
    for number, line in enumerate(log.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f'{log}:{number} is not JSON ({err}).') from err
        record = {}
        for key, value in entry.items():
            name = key[len('train/'):] if key.startswith('train/') else key
            if name.startswith(KEY_PREFIX) and isinstance(value, (int, float)):
                record[name[len(KEY_PREFIX):]] = float(value)
        if record and 'step' in entry:
            record['step'] = float(entry['step'])
            records.append(record)
    if not records:
        raise NoMonitorData(
            f'{log} has no GPUMonitorHook figures (no gpu_* keys). Add the hook to the '
            "config: custom_imports = dict(imports=['mmdet3d_scaling']) and "
            "custom_hooks = [dict(type='GPUMonitorHook')], then train again.")
    return records


def _series(records: Sequence[dict], key: str):
    points = [(r['step'], r[key]) for r in records if key in r and math.isfinite(r[key])]
    return [p[0] for p in points], [p[1] for p in points]


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_lines(records: Sequence[dict], out_dir: Path) -> List[Path]:
    written = []
    for file_name, title, ylabel, keys in LINE_PLOTS:
        present = [k for k in keys if _series(records, k)[0]]
        if not present:
            continue
        fig, ax = plt.subplots(figsize=(8, 4))
        for key in present:
            ax.plot(*_series(records, key), label=key, marker='.')
        ax.set(title=title, xlabel='iteration', ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        written.append(_save(fig, out_dir / file_name))
    return written


def plot_across_ranks(records: Sequence[dict], out_dir: Path) -> Optional[Path]:
    keys = [k for k in ACROSS_RANK_KEYS if _series(records, f'{k}_min')[0]]
    if not keys:
        return None
    fig, axes = plt.subplots(len(keys), 1, figsize=(8, 2.6 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        steps, low = _series(records, f'{key}_min')
        _, high = _series(records, f'{key}_max')
        ax.fill_between(steps, low, high, color='tab:blue', alpha=0.25,
                        label='min..max over ranks')
        ax.plot(steps, low, color='tab:blue', lw=1, marker='.')
        ax.plot(steps, high, color='tab:blue', lw=1, marker='.')
        own_steps, own = _series(records, key)
        if own_steps:  # the JSON log is written by rank 0
            ax.plot(own_steps, own, '--', color='tab:orange', label='rank 0')
        ax.set(title=key, xlabel='iteration')
        ax.grid(alpha=0.3)
        ax.legend(fontsize='small')
    return _save(fig, out_dir / 'across_ranks.png')


def plot(log: Path, out_dir: Path) -> List[Path]:
    records = load_monitor_records(log)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = plot_lines(records, out_dir)
    spread = plot_across_ranks(records, out_dir)
    return written + ([spread] if spread else [])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('log', type=Path,
                        help='JSON log, vis_data folder, run folder or work dir')
    parser.add_argument('--out-dir', type=Path, default=None,
                        help='where the PNGs go (default: gpu_monitor_plots/ next to '
                             'the log)')
    args = parser.parse_args(argv)
    try:
        log = find_log(args.log)
        out_dir = args.out_dir or log.parent / 'gpu_monitor_plots'
        written = plot(log, out_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 1
    print(f'{log}: {len(written)} plots')
    for path in written:
        print(f'  {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
