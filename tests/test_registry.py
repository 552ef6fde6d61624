"""Registration: plain mmdet3d names when free, ``mmdet3d_scaling.<name>`` always, no
wrapped mmengine internals, and clear errors around mmdet3d's own projects/ twins."""
import importlib
import subprocess
import sys
import textwrap

import pytest
import mmdet3d_scaling  # noqa: F401
from mmdet3d.registry import MODELS, TRANSFORMS

# What projects/BEVFusion/bevfusion/__init__.py does upstream: plain register_module().
UPSTREAM_TWIN = textwrap.dedent('''
    from mmdet3d.registry import MODELS, TRANSFORMS
    from torch import nn

    @MODELS.register_module()
    class BEVFusion(nn.Module):
        def __init__(self, data_preprocessor=None, pts_middle_encoder=None):
            super().__init__()

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


def test_no_registry_internals_are_wrapped():
    for registry in (MODELS, TRANSFORMS):
        assert '_register_module' not in vars(registry)


def test_scoped_names_always_mean_ours():
    assert MODELS.get('mmdet3d_scaling.BEVFusion').__module__.startswith('mmdet3d_scaling')
    assert TRANSFORMS.get('mmdet3d_scaling.GridMask').__module__.startswith(
        'mmdet3d_scaling')


@pytest.mark.slow
def test_upstream_twin_imported_after_us_is_refused_by_mmengine(tmp_path):
    """mmengine's own duplicate-name error, naming our module: import the project first."""
    proc = _run(tmp_path, 'import mmdet3d_scaling\nimport projects.BEVFusion.bevfusion\n')
    assert proc.returncode != 0
    assert 'already registered' in proc.stderr
    assert 'mmdet3d_scaling.models.bevfusion' in proc.stderr


SCOPED = ('print(MODELS.get("mmdet3d_scaling.BEVFusion").__module__.split(".")[0])\n')


@pytest.mark.slow
def test_upstream_twin_imported_before_us_keeps_the_names(tmp_path):
    proc = _run(tmp_path, 'import projects.BEVFusion.bevfusion\nimport mmdet3d_scaling\n'
                + CHECK.splitlines()[0] + '\n' + SCOPED + CHECK)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _owners(proc) == ['projects.BEVFusion.bevfusion'] * 2
    assert proc.stdout.strip().splitlines()[-2] == 'mmdet3d_scaling'


@pytest.mark.slow
def test_our_options_on_the_upstream_twin_are_a_clear_error(tmp_path):
    code = ('import projects.BEVFusion.bevfusion\nimport mmdet3d_scaling\n'
            'from mmdet3d_scaling.registry import check_replaced_types\n'
            'check_replaced_types(dict(model=dict(type="BEVFusion", sparse_backend="spconv",'
            ' pts_middle_encoder=None)))\n')
    proc = _run(tmp_path, code)
    assert proc.returncode != 0
    assert "model: type 'BEVFusion' is projects.BEVFusion.bevfusion.BEVFusion" in proc.stderr
    assert 'takes no sparse_backend' in proc.stderr
    assert "type='mmdet3d_scaling.BEVFusion'" in proc.stderr
