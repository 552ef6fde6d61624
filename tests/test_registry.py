"""Registration tolerates re-imports and mmdet3d's own projects/ twins (either order)."""
import importlib
import subprocess
import sys
import textwrap

import mmdet3d_scaling  # noqa: F401
from mmdet3d.registry import MODELS, TRANSFORMS

# What projects/BEVFusion/bevfusion/__init__.py does upstream: plain register_module().
UPSTREAM_TWIN = textwrap.dedent('''
    from mmdet3d.registry import MODELS, TRANSFORMS
    from torch import nn

    @MODELS.register_module()
    class BEVFusion(nn.Module):
        pass

    @TRANSFORMS.register_module()
    class GridMask:
        pass
''')


def test_registered_under_upstream_names():
    assert MODELS.get('BEVFusion').__module__.startswith('mmdet3d_scaling')
    assert TRANSFORMS.get('GridMask').__module__.startswith('mmdet3d_scaling')


def test_reimport_does_not_crash():
    module = importlib.import_module('mmdet3d_scaling.models.bevfusion.bevfusion')
    reloaded = importlib.reload(module)
    assert MODELS.get('BEVFusion') is reloaded.BEVFusion


def _run(tmp_path, code: str) -> subprocess.CompletedProcess:
    pkg = tmp_path / 'projects' / 'BEVFusion' / 'bevfusion'
    pkg.mkdir(parents=True, exist_ok=True)
    for folder in (tmp_path / 'projects', tmp_path / 'projects' / 'BEVFusion'):
        (folder / '__init__.py').write_text('')
    (pkg / '__init__.py').write_text(UPSTREAM_TWIN)
    return subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True,
                          text=True)


def _owners(proc: subprocess.CompletedProcess) -> list:
    """Modules owning BEVFusion and GridMask, from CHECK's line (logs come before it)."""
    return proc.stdout.strip().splitlines()[-1].split()


CHECK = ('from mmdet3d.registry import MODELS, TRANSFORMS\n'
         'print(MODELS.get("BEVFusion").__module__, TRANSFORMS.get("GridMask").__module__)\n')


def test_upstream_twin_imported_after_us_takes_the_names(tmp_path):
    proc = _run(tmp_path, 'import mmdet3d_scaling\nimport projects.BEVFusion.bevfusion\n'
                + CHECK)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _owners(proc) == ['projects.BEVFusion.bevfusion'] * 2


def test_upstream_twin_imported_before_us_keeps_the_names(tmp_path):
    proc = _run(tmp_path, 'import projects.BEVFusion.bevfusion\nimport mmdet3d_scaling\n'
                + CHECK)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _owners(proc) == ['projects.BEVFusion.bevfusion'] * 2
