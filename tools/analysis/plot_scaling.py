#!/usr/bin/env python
"""Plot one or more ``tools/benchmark_scaling.py`` results on one chart.

Each input is a ``scaling.json`` written by the benchmark (or a file in the same format
with a ``rows`` list); rows with the same ``label`` form one line. The chart is the
benchmark's own (samples/s against the linear line, scaling efficiency)::

    python tools/analysis/plot_scaling.py work_dirs/bench_a/scaling.json \\
        work_dirs/bench_b/scaling.json --out scaling.png --title "2 x H200"
"""
import argparse
import os.path as osp
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmdet3d_scaling.diagnostics.scaling_benchmark import load_rows, plot  # noqa: E402


def main(argv: Optional[List[str]] = None) -> Path:
    """Parse the arguments, plot the rows; the PNG's path."""
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('results', nargs='+', help='scaling.json files')
    p.add_argument('--out', default='scaling.png',
                   help='PNG to write (default scaling.png)')
    p.add_argument('--title', default=None,
                   help='chart title (default: the input paths)')
    args = p.parse_args(argv)
    rows = load_rows(args.results)
    plot(dict(config=args.title or ', '.join(args.results), rows=rows), args.out)
    print(f'wrote {args.out}')
    return Path(args.out)


if __name__ == '__main__':
    main()
