"""tools/analysis/plot_scaling.py: one chart from benchmark_scaling results."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmdet3d_scaling.diagnostics.scaling_benchmark import load_rows

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / 'tools' / 'analysis' / 'plot_scaling.py'
MEASURED = REPO / 'docs' / 'data' / 'scaling_h200_x2.json'


@pytest.mark.slow
def test_plots_the_measured_rows(tmp_path):
    out = tmp_path / 'chart.png'
    proc = subprocess.run([sys.executable, str(TOOL), str(MEASURED), '--out', str(out)],
                          cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'wrote {out}' in proc.stdout
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_rows_without_figures_are_named(tmp_path):
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps(dict(rows=[dict(label='x', world_size=1)])))
    with pytest.raises(SystemExit, match=r"row 0 lacks \['samples_per_s'\]"):
        load_rows([str(bad)])
    empty = tmp_path / 'empty.json'
    empty.write_text(json.dumps(dict(rows=[])))
    with pytest.raises(SystemExit, match='no rows in'):
        load_rows([str(empty)])
