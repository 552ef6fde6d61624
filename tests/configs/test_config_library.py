"""The config library under configs/: every file loads, and the per-GPU-count variants
of each family keep the recipe's effective batch and LR under the scaling engine on
1, 2, 4 and 8 processes (``prepare_config`` as the Runner runs it, launcher env set)."""
import copy
import glob
import os.path as osp
from functools import lru_cache

import pytest
from mmengine.config import Config

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.config.preparation import prepare_config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = osp.join(REPO, 'configs')
ALL = sorted(p for p in glob.glob(osp.join(CONFIGS, '**', '*.py'), recursive=True)
             if '_base_' not in p.split(osp.sep))
WORLD_SIZES = (1, 2, 4, 8)
MMDET3D_CONFIGS = osp.join(osp.dirname(__import__('mmdet3d').__file__), '.mim', 'configs')

# family: (variant file with {n} GPUs and {acc} ('-accK' the accumulation planned for
#          them, '' for none), recipe total batch, recipe LR (None: the 8-GPU file's),
#          stock mmdet3d config under mmdet3d's .mim/configs)
FAMILIES = {
    'pv_rcnn': ('pv_rcnn/pv_rcnn_{n}xb2{acc}-80e_kitti-3d-3class.py', 16, 1e-3,
                'pv_rcnn/pv_rcnn_8xb2-80e_kitti-3d-3class.py'),
    'second': ('second/second_hv_secfpn_{n}xb6{acc}-80e_kitti-3d-3class.py', 48, None,
               'second/second_hv_secfpn_8xb6-80e_kitti-3d-3class.py'),
    'pointpillars': ('pointpillars/pointpillars_hv_secfpn_{n}xb6{acc}-160e_kitti-3d-3class.py',
                     48, None,
                     'pointpillars/pointpillars_hv_secfpn_8xb6-160e_kitti-3d-3class.py'),
    'bevfusion_lidar': ('bevfusion/bevfusion_lidar_voxel0075_second_secfpn_{n}xb4{acc}-cyclic-'
                        '20e_nus-3d.py', 32, 1e-4, None),
    'bevfusion_lidar_cam': ('bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_{n}xb4{acc}-'
                            '6e_nus-3d.py', 32, None, None),
}
ACC = {1: '-acc8', 2: '-acc4', 4: '-acc2', 8: ''}  # every family: 8 GPUs need none


def variant(family: str, n: int) -> str:
    """The file of a family named for n GPUs."""
    return FAMILIES[family][0].format(n=n, acc=ACC[n])


# Former names kept as one-line aliases (old -> new, under configs/).
ALIASES = {pattern.format(n=n, acc=''): pattern.format(n=n, acc=ACC[n])
           for pattern, *_ in FAMILIES.values() for n in (1, 2, 4)}
ALIASES.update({
    'bevfusion/bevfusion_lidar_voxel0075_second_secfpn_nus-3d.py':
        'bevfusion/bevfusion_lidar_voxel0075_second_secfpn_cyclic-20e_nus-3d.py',
    'bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_nus-3d.py':
        'bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_6e_nus-3d.py',
    'bevfusion_1gpu.py':
        'bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_fit-24gib-amp-6e_nus-3d.py',
})


@lru_cache(maxsize=None)
def _load(path: str) -> Config:
    return Config.fromfile(path)


def _prepared(path: str, world_size: int, monkeypatch) -> Config:
    for key, value in (('RANK', '0'), ('LOCAL_RANK', '0'), ('WORLD_SIZE', str(world_size)),
                       ('MASTER_ADDR', '127.0.0.1'), ('MASTER_PORT', '29500')):
        monkeypatch.setenv(key, value)
    cfg = copy.deepcopy(_load(path))
    cfg.launcher = 'pytorch'
    cfg.preflight = dict(check_data=False)  # the KITTI / nuScenes data is not here
    return prepare_config(cfg)


def _effective(cfg: Config, world_size: int):
    acc = cfg.optim_wrapper.get('accumulative_counts', 1)
    return (cfg.train_dataloader.batch_size * world_size * acc,
            cfg.optim_wrapper.optimizer.lr)


@pytest.mark.parametrize('path', ALL, ids=lambda p: osp.relpath(p, CONFIGS))
def test_every_config_loads(path):
    cfg = _load(path)
    assert cfg.get('model') is not None and cfg.get('train_dataloader') is not None
    if cfg.get('scaling'):  # the plugin's key needs the plugin imported by the config
        assert 'mmdet3d_scaling' in cfg.custom_imports['imports']


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_variants_keep_effective_batch_and_lr(family, monkeypatch):
    _, total, lr, stock = FAMILIES[family]
    if lr is None:
        lr = _load(osp.join(CONFIGS, variant(family, 8))).optim_wrapper.optimizer.lr
    if stock is not None:  # the recipe's LR is the stock 8-GPU config's
        stock_cfg = Config.fromfile(osp.join(MMDET3D_CONFIGS, stock))
        assert stock_cfg.optim_wrapper.optimizer.lr == pytest.approx(lr)
    seen = {}
    for named in WORLD_SIZES:
        path = osp.join(CONFIGS, variant(family, named))
        for world_size in WORLD_SIZES:
            cfg = _prepared(path, world_size, monkeypatch)
            batch, got_lr = _effective(cfg, world_size)
            seen[(named, world_size)] = (batch, cfg.train_dataloader.batch_size)
            if named == world_size:  # the name's accumulation is the one planned
                acc = cfg.optim_wrapper.get('accumulative_counts', 1)
                assert ACC[named] == (f'-acc{acc}' if acc > 1 else ''), (path, acc)
            assert batch == total, (path, world_size)
            assert got_lr == pytest.approx(lr), (path, world_size)
    # the file named for N GPUs splits as named when started on N
    per_gpu = {seen[(n, n)][1] for n in WORLD_SIZES}
    assert len(per_gpu) == 1, per_gpu


def test_pv_rcnn_auto_scale_lr_base_matches_the_recipe():
    stock = Config.fromfile(
        osp.join(MMDET3D_CONFIGS, 'pv_rcnn/pv_rcnn_8xb2-80e_kitti-3d-3class.py'))
    assert stock.auto_scale_lr.base_batch_size == 48  # inherited from SECOND's 8 x 6
    assert stock.train_dataloader.batch_size * 8 == 16
    for n in WORLD_SIZES:
        cfg = _load(osp.join(CONFIGS, variant('pv_rcnn', n)))
        assert cfg.auto_scale_lr.base_batch_size == 16
        assert cfg.auto_scale_lr.enable is False  # the scaling key owns the LR


def test_sync_bn_on_multi_process_plain_bn_alone(monkeypatch):
    path = osp.join(CONFIGS, variant('pv_rcnn', 2))
    wrapper = _prepared(path, 2, monkeypatch).model_wrapper_cfg
    assert wrapper.sync_bn == 'allreduce'
    cfg = copy.deepcopy(_load(path))  # python tools/train.py: no launcher, no wrapper
    cfg.launcher = 'none'
    cfg.preflight = dict(check_data=False)
    prepared = prepare_config(cfg)
    assert (prepared.get('model_wrapper_cfg') or {}).get('sync_bn') is None
    assert _effective(prepared, 1)[0] == 16


@pytest.mark.parametrize('old', sorted(ALIASES))
def test_former_names_are_one_line_aliases(old):
    """Each former name is comments plus ``_base_ = ['<new name>']`` and loads the same
    config as the new name (commands and docs that use the old name keep working)."""
    path = osp.join(CONFIGS, old)
    code = [line for line in open(path).read().splitlines()
            if line.strip() and not line.lstrip().startswith('#')]
    assert len(code) == 1 and code[0].startswith('_base_ = ['), code
    target = osp.normpath(osp.join(osp.dirname(path), code[0].split("'")[1]))
    assert target == osp.join(CONFIGS, ALIASES[old])
    assert 'former name' in open(path).read() or old == 'bevfusion_1gpu.py'
    assert _load(path).to_dict() == _load(target).to_dict()


def test_the_one_gpu_bevfusion_names_say_their_plans(monkeypatch):
    """..._1xb2-amp-acc16-6e_nus-3d.py = 2 a GPU x 1 x accumulation 16 with AMP, as its
    name says; configs/bevfusion_1gpu.py (alias of ..._fit-24gib-amp-6e_nus-3d.py)
    chooses the fastest fit in 24 GiB at start, from 4 x 1 x 8 down."""
    fixed = 'bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_1xb2-amp-acc16-6e_nus-3d.py'
    cfg = _prepared(osp.join(CONFIGS, fixed), 1, monkeypatch)
    assert cfg.train_dataloader.batch_size == 2
    assert cfg.optim_wrapper.accumulative_counts == 16
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    cfg = _prepared(osp.join(CONFIGS, 'bevfusion_1gpu.py'), 1, monkeypatch)
    assert cfg.scaling.memory_budget == '24GiB'
    assert 'FastestFitHook' in [h['type'] for h in cfg.custom_hooks]
    assert cfg.train_dataloader.batch_size == 4
    assert cfg.optim_wrapper.accumulative_counts == 8
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'


@pytest.mark.slow  # >= 4 s on 2 cores (measured)
def test_docs_table_lists_every_config_as_planned():
    """docs/configs.md's table of every config file (family, per-GPU batch x GPUs x
    accumulation, effective batch, LR, precision, alias of) is what the files plan."""
    from tests.configs import config_table
    assert config_table.doc_table() == config_table.table(), (
        'docs/configs.md is out of date: run python -m tests.configs.config_table')
    listed = config_table.doc_table().count('\n| `')
    assert listed == len(ALL)
    for old, new in ALIASES.items():
        assert f'| `{old}` |' in config_table.doc_table()
        assert config_table.alias_target(old) == new
