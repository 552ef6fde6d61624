#!/usr/bin/env python
"""Plot one or more ``tools/benchmark_scaling.py`` results on one chart.

Each input is a ``scaling.json`` written by the benchmark (or a file in the same format
with a ``rows`` list); rows with the same ``label`` form one line. The chart is the
benchmark's own (samples/s against the linear line, scaling efficiency)::

    python tools/analysis/plot_scaling.py work_dirs/bench_a/scaling.json \\
        work_dirs/bench_b/scaling.json --out scaling.png --title "2 x H200"
"""
import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any, Dict, List

TOOL = Path(__file__).resolve().parents[1] / 'benchmark_scaling.py'
REQUIRED = ('label', 'world_size', 'samples_per_s')


def _benchmark_module():
    spec = importlib.util.spec_from_file_location('benchmark_scaling', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_rows(paths: List[str]) -> List[Dict[str, Any]]:
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


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('results', nargs='+', help='scaling.json files')
    p.add_argument('--out', default='scaling.png')
    p.add_argument('--title', default=None)
    args = p.parse_args(argv)
    rows = load_rows(args.results)
    _benchmark_module().plot(dict(config=args.title or ', '.join(args.results), rows=rows),
                             args.out)
    print(f'wrote {args.out}')
    return Path(args.out)


if __name__ == '__main__':
    main()
