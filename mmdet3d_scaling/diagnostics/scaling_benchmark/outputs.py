"""What a benchmark leaves under ``--out``: ``scaling.json`` (every figure),
``scaling.md`` (the tables) and ``scaling.png`` (samples/s and efficiency against the
process count); and the rows of written ``scaling.json`` files, read back for a chart
of several results (``tools/analysis/plot_scaling.py``)."""
import json
import math
import os
from typing import Any, Dict, List

from .tables import (ddp_one_table, independent_table, markdown_table, profile_table,
                     repeats_table)

# what a row needs to be plotted
REQUIRED = ('label', 'world_size', 'samples_per_s')


def plot(result: Dict[str, Any], path: str) -> None:
    """samples/s (against the linear line) and efficiency per process count, a line per
    row label, as a PNG."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for row in result['rows']:
        groups.setdefault(row['label'], []).append(row)
    for label, rows in groups.items():
        rows = sorted(rows, key=lambda r: r['world_size'])
        ns = [r['world_size'] for r in rows]
        ax1.plot(ns, [r['samples_per_s'] for r in rows], 'o-', label=label)
        if len(rows) > 1:
            ideal = [rows[0]['samples_per_s'] * n / ns[0] for n in ns]
            ax1.plot(ns, ideal, ':', color='grey', label=f'{label} (linear)')
        ax2.plot(ns, [r.get('efficiency', math.nan) for r in rows], 'o-', label=label)
    ax1.set_xlabel('GPUs (processes)')
    ax1.set_ylabel('samples/s')
    ax1.legend(fontsize=7)
    ax2.axhline(1.0, color='grey', linestyle=':')
    ax2.set_ylim(0, 1.1)
    ax2.set_xlabel('GPUs (processes)')
    ax2.set_ylabel('scaling efficiency')
    fig.suptitle(os.path.basename(result['config']))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(result: Dict[str, Any], out: str) -> None:
    """scaling.json, scaling.md and scaling.png under ``out``; the tables to stdout."""
    with open(os.path.join(out, 'scaling.json'), 'w') as f:
        json.dump(result, f, indent=1)
    table = markdown_table(result)
    for extra in (repeats_table(result), profile_table(result),
                  independent_table(result), ddp_one_table(result)):
        if extra:
            table += '\n\n' + extra
    with open(os.path.join(out, 'scaling.md'), 'w') as f:
        f.write(f"Command: `{result['command']}`\n\n{table}\n")
    plot(result, os.path.join(out, 'scaling.png'))
    print(table, flush=True)
    print(f'[benchmark_scaling] wrote {out}/scaling.json, scaling.md, scaling.png')


def load_rows(paths: List[str]) -> List[Dict[str, Any]]:
    """The rows of ``scaling.json`` files, in order; a row without the plotted figures,
    or no row at all, is an error that names the file."""
    rows = []
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        for i, row in enumerate(result.get('rows') or []):
            missing = [k for k in REQUIRED if k not in row]
            if missing:
                raise SystemExit(f'plot_scaling: {path} row {i} lacks {missing}; expected '
                                 'the rows of a benchmark_scaling.py scaling.json.')
            rows.append(row)
    if not rows:
        raise SystemExit(f'plot_scaling: no rows in {paths}')
    return rows
