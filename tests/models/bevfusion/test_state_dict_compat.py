"""State-dict compatibility with mmdet3d 1.4's official BEVFusion checkpoints.

- The LiDAR-only model has exactly the official state-dict names and shapes (306
  entries, 8,315,898 numbers; sparse-conv weights compared in spconv 2's layout; the
  reference is tests/data/reference). It is built from the official config with only
  custom_imports changed when ``MMDET3D_BEVFUSION_LIDAR_CONFIG`` names that file in an
  mmdet3d 1.4 source checkout (upstream code is not copied into this repository), else
  from this project's own recipe, configs/bevfusion/.
- A fake official-format checkpoint (official names and shapes, random values, sparse
  weights in spconv or mmcv layout) loads through mmengine's ``load_checkpoint`` and a
  real Runner's ``load_from``, and every value lands.
- A model loaded from another model's checkpoint gives the same outputs.
"""
import json
import math
import os
import os.path as osp
import shutil

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner, load_checkpoint

import mmdet3d
from mmdet3d_scaling.models.bevfusion import sparse_backend as sb

from .common import (LIDAR_CONFIG_NAME, REFERENCE_JSON, REPO, build, tiny_model_cfg,
                     toy_batch)

OUR_LIDAR_CONFIG = osp.join(REPO, 'configs', 'bevfusion',
                            'bevfusion_lidar_voxel0075_second_secfpn_nus-3d.py')

pytest.importorskip('spconv.pytorch')
UPSTREAM_IMPORT = "imports=['projects.BEVFusion.bevfusion']"
OUR_IMPORT = "imports=['mmdet3d_scaling']"


@pytest.fixture(scope='module')
def reference():
    if not osp.isfile(REFERENCE_JSON):
        pytest.skip(f'{REFERENCE_JSON} not available')
    with open(REFERENCE_JSON) as f:
        return json.load(f)


def upstream_tree(root: str, *config_files: str) -> str:
    """Lay out mmdet3d's source tree under ``root``: configs/_base_ (from the wheel)
    and projects/BEVFusion/configs/ with the given upstream configs, custom_imports
    switched to this package. Returns the config folder."""
    base_src = osp.join(osp.dirname(mmdet3d.__file__), '.mim', 'configs', '_base_',
                        'default_runtime.py')
    base_dir = osp.join(root, 'configs', '_base_')
    cfg_dir = osp.join(root, 'projects', 'BEVFusion', 'configs')
    for d in (base_dir, cfg_dir):
        os.makedirs(d, exist_ok=True)
    shutil.copy(base_src, base_dir)
    for path in config_files:
        with open(path) as f:
            text = f.read()
        assert text.count(UPSTREAM_IMPORT) <= 1
        with open(osp.join(cfg_dir, osp.basename(path)), 'w') as f:
            f.write(text.replace(UPSTREAM_IMPORT, OUR_IMPORT))
    return cfg_dir


@pytest.fixture(scope='module')
def official_lidar_model(tmp_path_factory):
    upstream = os.environ.get('MMDET3D_BEVFUSION_LIDAR_CONFIG')
    if upstream:
        cfg_dir = upstream_tree(str(tmp_path_factory.mktemp('mmdet3d')), upstream)
        cfg = Config.fromfile(osp.join(cfg_dir, osp.basename(upstream)))
    else:
        cfg = Config.fromfile(OUR_LIDAR_CONFIG)
    assert cfg.custom_imports['imports'] == ['mmdet3d_scaling']
    return build(cfg.model)  # in mmdet3d's scope, whatever an earlier test left


def spconv_shapes(model) -> dict:
    """name -> shape of ``model``'s state dict, sparse-conv weights in spconv layout."""
    sparse = {f'{n}.weight': m for n, m in sb.iter_sparse_convs(model)}
    shapes = {}
    for name, value in model.state_dict().items():
        if name in sparse:
            value = sb.to_layout(value, sb.module_layout(sparse[name]), sb.SPCONV)
        shapes[name] = list(value.shape)
    return shapes


def test_official_lidar_config_state_dict_matches_reference(official_lidar_model, reference):
    expected = reference[LIDAR_CONFIG_NAME]
    ours = spconv_shapes(official_lidar_model)
    assert sorted(set(expected) - set(ours)) == []  # missing in ours
    assert sorted(set(ours) - set(expected)) == []  # extra in ours
    assert {k: v for k, v in ours.items() if expected[k] != v} == {}
    assert len(ours) == 306
    assert sum(math.prod(s) for s in ours.values()) == 8_315_898


def fake_official_state_dict(shapes: dict, layout: str, model) -> dict:
    """Random values with the official names and shapes; sparse weights in ``layout``."""
    gen = torch.Generator().manual_seed(0)
    sparse = {f'{n}.weight' for n, _ in sb.iter_sparse_convs(model)}
    state = {}
    for name, shape in shapes.items():
        if name.endswith('num_batches_tracked'):
            value = torch.tensor(12345)
        elif name.endswith('running_var'):
            value = torch.rand(shape, generator=gen) + 0.5
        else:
            value = torch.randn(shape, generator=gen)
        if name in sparse:
            value = sb.to_layout(value, sb.SPCONV, layout)
        state[name] = value
    return state


def save_mmengine_checkpoint(path: str, state_dict: dict) -> str:
    """What mmengine's CheckpointHook writes, minus the optimizer (not needed)."""
    torch.save(dict(meta=dict(epoch=20, iter=123, mmengine_version='0.10.7',
                              experiment_name='official'),
                    state_dict=state_dict), path)
    return path


def assert_values_landed(model, state: dict) -> None:
    sparse = {f'{n}.weight': m for n, m in sb.iter_sparse_convs(model)}
    loaded = model.state_dict()
    assert set(loaded) == set(state)
    for name, value in state.items():
        got = loaded[name]
        if name in sparse:
            src = sb.checkpoint_layout(value, sparse[name])
            value = sb.to_layout(value, src, sb.module_layout(sparse[name]))
        assert torch.equal(got, value), name


@pytest.mark.parametrize('layout', ['spconv', 'mmcv'])
def test_fake_official_checkpoint_loads(official_lidar_model, reference, tmp_path, layout):
    model = official_lidar_model
    state = fake_official_state_dict(reference[LIDAR_CONFIG_NAME], layout, model)
    path = save_mmengine_checkpoint(str(tmp_path / f'official_{layout}.pth'), state)
    checkpoint = load_checkpoint(model, path, map_location='cpu', strict=True)
    assert checkpoint['meta']['epoch'] == 20
    assert_values_landed(model, state)


def _perturbed(model, seed: int):
    """Random values everywhere (BN statistics too), so a wrong load shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if value.dtype.is_floating_point:
                noise = torch.rand(value.shape, generator=gen) * 0.1
                value.copy_(value + noise if 'running_var' in name else
                            value + noise - 0.05)
    return model


@pytest.mark.parametrize('layout', ['spconv', 'mmcv'])
def test_runner_load_from_gives_same_outputs(tmp_path, layout):
    source = _perturbed(build(tiny_model_cfg()), seed=1).eval()
    state = dict(source.state_dict())
    if layout == 'mmcv':
        state = sb.convert_state_dict_layout(state, source, 'mmcv')
        assert state['pts_middle_encoder.conv_input.0.weight'].shape == (3, 3, 3, 5, 8)
    path = save_mmengine_checkpoint(str(tmp_path / 'src.pth'), state)

    target = _perturbed(build(tiny_model_cfg()), seed=2)
    runner = Runner(model=target, work_dir=str(tmp_path / 'work'), load_from=path,
                    default_scope='mmdet3d')
    runner.load_or_resume()
    loaded = runner.model.eval()
    source = source.to(next(loaded.parameters()).device)  # the runner's device (CUDA there)

    batch = toy_batch(seed=3)
    with torch.no_grad():
        inputs = source.data_preprocessor(batch, False)
        ref = source(**inputs, mode='tensor')[0][0]
        out = loaded(**inputs, mode='tensor')[0][0]
        ref_det = source(**inputs, mode='predict')
        out_det = loaded(**inputs, mode='predict')
    assert set(ref) == set(out)
    for key in ref:
        assert torch.equal(ref[key], out[key]), key
    for a, b in zip(ref_det, out_det):
        assert torch.equal(a.pred_instances_3d.bboxes_3d.tensor,
                           b.pred_instances_3d.bboxes_3d.tensor)
        assert torch.equal(a.pred_instances_3d.scores_3d, b.pred_instances_3d.scores_3d)


def test_our_lidar_config_builds_the_official_model(official_lidar_model, reference):
    """configs/bevfusion/...nus-3d.py (this package's recipe) has the official model."""
    from .common import REPO
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'bevfusion',
                                   'bevfusion_lidar_voxel0075_second_secfpn_nus-3d.py'))
    ours = spconv_shapes(build(cfg.model))
    assert ours == reference[LIDAR_CONFIG_NAME]
