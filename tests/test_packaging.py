"""The built distributions carry ``configs/`` and ``tools/`` the OpenMMLab way.

Builds from a copy of the source tree in a temp folder (nothing is written into the
checkout, and no ``.mim`` left there by an editable install can fill the gap), with the
test environment's setuptools and no network: ``pip wheel --no-build-isolation`` (what
``pip install .`` does) and ``python -m build --no-isolation`` (sdist, then the wheel
from that sdist). Every config under ``configs/`` and every tool but the checkout-only
bootstrap scripts must be in ``mmdet3d_scaling/.mim/``, as plain files.
"""
import ast
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Set

import pytest

REPO = Path(__file__).resolve().parents[1]
MIM = 'mmdet3d_scaling/.mim/'
# not copied: environments, outputs, caches, and the symlinks of an editable install
_SKIP = {'.git', '.venv', 'build', 'dist', 'data', 'work_dirs', '.device', '.whl',
         '__pycache__', '.pytest_cache', '.mim'}


def _checkout_only_tools() -> Set[str]:
    """``CHECKOUT_ONLY_TOOLS`` as setup.py declares it (read, not imported: importing
    setup.py runs setup())."""
    for node in ast.parse((REPO / 'setup.py').read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], 'id', '') == \
                'CHECKOUT_ONLY_TOOLS':
            return set(ast.literal_eval(node.value))
    raise AssertionError('setup.py declares no CHECKOUT_ONLY_TOOLS')


def _files(folder: str) -> Set[str]:
    root = REPO / folder
    return {p.relative_to(REPO).as_posix() for p in root.rglob('*')
            if p.is_file() and '__pycache__' not in p.parts and p.suffix != '.pyc'}


def expected_mim() -> Set[str]:
    """Every file of configs/ and tools/ (less the checkout-only scripts) under .mim/."""
    skipped = {f'tools/{name}' for name in _checkout_only_tools()}
    assert skipped <= _files('tools'), 'a CHECKOUT_ONLY_TOOLS entry is not in tools/'
    return {MIM + f for f in (_files('configs') | _files('tools')) - skipped} | \
        {MIM + 'model-index.yml'}


@pytest.fixture(scope='module')
def source(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp('src') / 'mmdet3d-scaling'
    shutil.copytree(REPO, dest, symlinks=True,
                    ignore=lambda d, names: [n for n in names if n in _SKIP
                                             or n.endswith('.egg-info')])
    return dest


def _run(*cmd: str, cwd: Path) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def _wheel_names(wheel: Path) -> Set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {n for n in zf.namelist() if n.startswith(MIM)}


@pytest.mark.slow
def test_wheel_ships_every_config_and_tool(source, tmp_path):
    _run(sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
         '--disable-pip-version-check', '-w', str(tmp_path), str(source), cwd=tmp_path)
    [wheel] = tmp_path.glob('*.whl')
    names = _wheel_names(wheel)
    expected = expected_mim()
    assert f'{MIM}configs/demo/pointpillars_synthetic_kitti_cpu.py' in names
    assert f'{MIM}tools/train.py' in names
    assert sorted(expected - names) == [], 'missing from the wheel'
    assert sorted(names - expected) == [], 'in the wheel but not in the checkout'
    with zipfile.ZipFile(wheel) as zf:
        record = zf.read(next(n for n in zf.namelist() if n.endswith('.dist-info/RECORD')))
        # mim's model index: the repository's, whose imports are the shipped metafiles
        assert zf.read(f'{MIM}model-index.yml') == (REPO / 'model-index.yml').read_bytes()
    assert f'{MIM}configs/bevfusion/metafile.yml' in names
    assert f'{MIM}tools/train.py,'.encode() in record  # installed and uninstalled by pip
    _check_license(wheel)


def _check_license(wheel: Path) -> None:
    """The wheel's metadata names Apache-2.0 and the wheel carries the LICENSE file."""
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist()
                                if n.endswith('.dist-info/METADATA'))).decode()
        licenses = [n for n in zf.namelist() if '.dist-info/' in n and
                    n.rsplit('/', 1)[-1] == 'LICENSE']
        assert licenses and zf.read(licenses[0]) == (REPO / 'LICENSE').read_bytes()
    assert 'Classifier: License :: OSI Approved :: Apache Software License' in metadata
    assert ('License: Apache License 2.0' in metadata
            or 'License-Expression: Apache' in metadata), metadata[:1500]


@pytest.mark.slow
def test_sdist_carries_mim_and_the_wheel_built_from_it_is_complete(source, tmp_path):
    _run(sys.executable, '-m', 'build', '--no-isolation', '--outdir', str(tmp_path),
         str(source), cwd=tmp_path)
    [sdist], [wheel] = tmp_path.glob('*.tar.gz'), tmp_path.glob('*.whl')
    with tarfile.open(sdist) as tf:
        members = {m.name.split('/', 1)[1]: m for m in tf.getmembers() if '/' in m.name}
    in_sdist = {n for n, m in members.items() if n.startswith(MIM) and m.isfile()}
    assert not [n for n, m in members.items() if n.startswith(MIM) and m.issym()]
    assert in_sdist == expected_mim()
    assert _wheel_names(wheel) == expected_mim()
    assert 'LICENSE' in members and members['LICENSE'].isfile()
    _check_license(wheel)


def test_editable_install_links_mim_to_the_checkout():
    import mmdet3d_scaling
    package = Path(mmdet3d_scaling.__file__).resolve().parent
    assert package == REPO / 'mmdet3d_scaling', f'tests import {package}, not the checkout'
    mim = package / '.mim'
    for name in ('configs', 'tools'):
        link = mim / name
        assert link.is_symlink(), f'{link} is not a symlink: run `pip install -e .` again'
        assert os.readlink(link) == f'../../{name}'
        assert link.resolve() == REPO / name
    assert (mim / 'model-index.yml').is_file()
