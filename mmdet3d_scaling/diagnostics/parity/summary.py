"""Statistics over seeds per arrangement, the comparison with the reference, and the
docs' markdown table."""
import statistics
from typing import Any, Dict, Optional, Sequence

from .errors import ParityError
from .plan import Arrangement


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
