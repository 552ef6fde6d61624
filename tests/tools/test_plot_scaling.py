"""tools/analysis/plot_scaling.py: one chart from benchmark_scaling results."""
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / 'tools' / 'analysis' / 'plot_scaling.py'
MEASURED = REPO / 'docs' / 'data' / 'scaling_h200_x2.json'


def _tool():
    spec = importlib.util.spec_from_file_location('plot_scaling', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plots_the_measured_rows(tmp_path):
    out = _tool().main([str(MEASURED), '--out', str(tmp_path / 'chart.png')])
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_rows_without_figures_are_named(tmp_path):
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps(dict(rows=[dict(label='x', world_size=1)])))
    with pytest.raises(SystemExit, match=r"row 0 lacks \['samples_per_s'\]"):
        _tool().main([str(bad), '--out', str(tmp_path / 'c.png')])
