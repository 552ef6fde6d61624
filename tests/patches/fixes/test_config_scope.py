"""``mmdet3d_scaling::<config>`` resolves like ``mmdet3d::`` (patch ``config_scope``).

Uses the checkout's editable install, whose ``mmdet3d_scaling/.mim/configs`` links to
``configs/`` (tests/test_packaging.py checks the link; tools/check_install.sh checks the
installed wheel).
"""
from pathlib import Path

import pytest
from mmengine.config import Config
from mmengine.hub import get_config

import mmdet3d_scaling
from mmdet3d_scaling.patches import patching

DEMO = 'demo/pointpillars_synthetic_kitti_cpu.py'
MIM_CONFIGS = Path(mmdet3d_scaling.__file__).resolve().parent / '.mim' / 'configs'


def _strip_scope(value):
    if isinstance(value, dict):
        return {k: _strip_scope(v) for k, v in value.items() if k != '_scope_'}
    if isinstance(value, (list, tuple)):
        return type(value)(_strip_scope(v) for v in value)
    return value


def _user_config(tmp_path: Path, base: str) -> Config:
    path = tmp_path / f'user_{abs(hash(base))}.py'
    path.write_text(f'_base_ = [{base!r}]\n')
    return Config.fromfile(str(path))


def test_applied_on_import():
    assert 'config_scope' in patching.PATCHES, (
        'mmdet3d_scaling.patches.fixes.config_scope was not declared: it must sit in '
        'mmdet3d_scaling/patches/fixes/ and call patching.declare')
    assert 'config_scope' in patching.applied()


def test_upstream_refuses_the_package_without_the_patch(tmp_path):
    patching.revert(['config_scope'])
    try:
        with pytest.raises(AssertionError, match='does not support to load mmdet3d_scaling'):
            _user_config(tmp_path, f'mmdet3d_scaling::{DEMO}')
    finally:
        patching.apply(['config_scope'])


def test_base_by_package_path_equals_base_by_file(tmp_path):
    by_package = _user_config(tmp_path, f'mmdet3d_scaling::{DEMO}')
    by_file = _user_config(tmp_path, str(MIM_CONFIGS / DEMO))
    assert by_package.model._scope_ == 'mmdet3d'  # our configs are mmdet3d-scope configs
    assert _strip_scope(by_package.to_dict()) == _strip_scope(by_file.to_dict())
    from mmdet3d.registry import MODELS
    assert type(MODELS.build(by_package.model)).__name__ == 'VoxelNet'


def test_get_config_resolves_in_the_package_and_through_mmdet3d_bases():
    assert get_config(f'mmdet3d_scaling::{DEMO}').filename == str(MIM_CONFIGS / DEMO)
    cfg = get_config('mmdet3d_scaling::pv_rcnn/pv_rcnn_1xb2-80e_kitti-3d-3class.py')
    assert cfg.model.type == 'PointVoxelRCNN'  # ./ base, then an mmdet3d:: base


def test_short_names_at_the_top_of_configs_resolve(tmp_path):
    """``mmdet3d_scaling::bevfusion_1gpu.py`` has no folder: upstream's parser demands one
    (``pkg::folder/file``), the patch does not."""
    short = 'mmdet3d_scaling::bevfusion_1gpu.py'
    found = Path(get_config(short).filename)  # in the installed distribution's .mim
    assert found.parts[-3:] == ('.mim', 'configs', 'bevfusion_1gpu.py')
    assert found.read_text() == (MIM_CONFIGS / 'bevfusion_1gpu.py').read_text()
    by_package = _user_config(tmp_path, short)
    by_file = _user_config(tmp_path, str(MIM_CONFIGS / 'bevfusion_1gpu.py'))
    assert _strip_scope(by_package.to_dict()) == _strip_scope(by_file.to_dict())
    patching.revert(['config_scope'])
    try:
        with pytest.raises(ValueError, match='relative config path'):
            _user_config(tmp_path, short)
    finally:
        patching.apply(['config_scope'])


def test_bad_paths_name_the_value(tmp_path):
    with pytest.raises(FileNotFoundError, match='mmdet3d_scaling::demo/nope.py'):
        _user_config(tmp_path, 'mmdet3d_scaling::demo/nope.py')
    with pytest.raises(ValueError, match="'mmdet3d_scaling::demo::x.py'"):
        _user_config(tmp_path, 'mmdet3d_scaling::demo::x.py')


def test_other_packages_unchanged(tmp_path):
    cfg = _user_config(tmp_path, 'mmdet3d::pointpillars/'
                       'pointpillars_hv_secfpn_8xb6-160e_kitti-3d-3class.py')
    assert cfg.model.type == 'VoxelNet'
    with pytest.raises(AssertionError, match='does not support to load mmdet3d_scalin'):
        _user_config(tmp_path, 'mmdet3d_scalin::demo/x.py')
