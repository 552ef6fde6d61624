"""info_files: an empty or truncated info .pkl is named, with how to regenerate it."""
import os
import os.path as osp

import pytest

import mmdet3d_scaling  # noqa: F401  (applies the fixes set)
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.patches.fixes.info_files import CorruptInfoFileError
from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
from tests.datasets.synthetic_helpers import demo_config


@pytest.fixture(scope='module')
def kitti_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('info_files'))
    write_kitti(root, 1, 1, seed=0, progress=False)
    return root


def _copy(src: str, dst) -> str:
    import shutil
    shutil.copytree(src, str(dst))
    return str(dst)


def _build(cfg_dict: dict, registry: str = 'DATASETS'):
    import copy

    import mmdet3d.registry
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet3d')
    return getattr(mmdet3d.registry, registry).build(copy.deepcopy(cfg_dict))


def test_empty_ann_file_names_file_and_synthetic_command(tmp_path, kitti_root):
    root = _copy(kitti_root, tmp_path / 'kitti')
    path = osp.join(root, 'kitti_infos_val.pkl')
    open(path, 'wb').close()
    with pytest.raises(CorruptInfoFileError) as err:
        _build(demo_config(root).test_dataloader.dataset)
    msg = str(err.value)
    assert f'info file {path} is empty (0 bytes)' in msg
    assert 'EOFError: Ran out of input' in msg
    assert f'tools/create_synthetic_data.py kitti --out {root} --overwrite' in msg
    assert isinstance(err.value.__cause__, EOFError)


def test_truncated_ann_file_of_real_data_names_mmdet3d_converter(tmp_path, kitti_root):
    root = _copy(kitti_root, tmp_path / 'kitti')
    os.remove(osp.join(root, '.synthetic_kitti'))  # as the real dataset: no marker
    path = osp.join(root, 'kitti_infos_val.pkl')
    with open(path, 'r+b') as f:
        f.truncate(100)
    with pytest.raises(CorruptInfoFileError) as err:
        _build(demo_config(root).test_dataloader.dataset)
    msg = str(err.value)
    assert f'{path} cannot be read (100 bytes)' in msg and 'truncated' in msg
    assert (f"mmdet3d's `python tools/create_data.py kitti --root-path {root} "
            f'--out-dir {root}') in msg
    assert 'create_synthetic_data' not in msg


def test_truncated_db_infos_named_by_the_sampler(tmp_path, kitti_root):
    root = _copy(kitti_root, tmp_path / 'kitti')
    path = osp.join(root, 'kitti_dbinfos_train.pkl')
    with open(path, 'r+b') as f:
        f.truncate(20)
    step = next(s for s in demo_config(root).train_dataloader.dataset.dataset.pipeline
                if s['type'] == 'ObjectSample')
    with pytest.raises(CorruptInfoFileError, match=f'info file {path} cannot be read'):
        _build(step, 'TRANSFORMS')


def test_other_sampler_errors_and_missing_files_pass_through(tmp_path, kitti_root):
    step = next(s for s in demo_config(kitti_root).train_dataloader.dataset.dataset.pipeline
                if s['type'] == 'ObjectSample')
    step = dict(step, db_sampler=dict(step['db_sampler'], classes=None))
    with pytest.raises(TypeError) as err:  # not from reading the file: unchanged
        _build(step, 'TRANSFORMS')
    assert not isinstance(err.value, CorruptInfoFileError)
    cfg = demo_config(kitti_root).test_dataloader.dataset
    cfg.ann_file = str(tmp_path / 'absent.pkl')
    with pytest.raises(FileNotFoundError, match='absent.pkl'):
        _build(cfg)


@pytest.mark.parametrize('metric', ['KittiMetric', 'NuScenesMetric'])
def test_metrics_name_an_empty_ann_file(tmp_path, metric):
    dataset = metric[:-len('Metric')].lower()
    path = tmp_path / f'{dataset}_infos_val.pkl'
    path.write_bytes(b'')
    evaluator = _build(dict(type=metric, ann_file=str(path), data_root=str(tmp_path))
                       if metric == 'NuScenesMetric' else
                       dict(type=metric, ann_file=str(path)), 'METRICS')
    evaluator.dataset_meta = dict(classes=('car',), version='v1.0-trainval')
    with pytest.raises(CorruptInfoFileError, match=f'info file {path} is empty') as err:
        evaluator.compute_metrics([])
    assert f'create_data.py {dataset}' in str(err.value)


def test_upstream_error_names_no_file(tmp_path):
    """Why the patch exists: upstream's error for an empty info file."""
    path = tmp_path / 'kitti_infos_train.pkl'
    path.write_bytes(b'')
    from mmengine.dataset import base_dataset
    reverted = patching.revert(['info_files'])
    try:
        with pytest.raises(EOFError) as err:
            base_dataset.load(str(path))
        assert str(path) not in str(err.value)
    finally:
        patching.apply(reverted)
    with pytest.raises(CorruptInfoFileError):
        base_dataset.load(str(path))


@pytest.mark.parametrize('old_format', ['bare_list', 'infos_key'])
def test_a_bare_list_given_to_the_dataset_is_named(tmp_path, kitti_root, old_format):
    """KittiDataset(...) built directly (no preflight) with a pre-1.0 info file: used to
    be mmengine's TypeError / ValueError without the file's name."""
    import pickle
    from mmdet3d_scaling.patches.fixes.info_files import OldInfoFormatError
    root = _copy(kitti_root, tmp_path / 'kitti')
    path = osp.join(root, 'kitti_infos_val.pkl')
    with open(path, 'rb') as f:
        frames = pickle.load(f)['data_list']
    with open(path, 'wb') as f:
        pickle.dump(frames if old_format == 'bare_list' else dict(infos=frames), f)
    with pytest.raises(OldInfoFormatError) as err:
        _build(demo_config(root).test_dataloader.dataset)
    msg = str(err.value)
    shape = 'a bare list' if old_format == 'bare_list' else "a dict with keys ['infos']"
    assert f'info file {path} is {shape}: the info format of mmdet3d before 1.0' in msg
    assert (f'update_infos_to_v2.py --dataset kitti --pkl-path {path} --out-dir '
            f'{root}/v2') in msg
    assert f'point ann_file at {root}/v2/kitti_infos_val.pkl' in msg  # the f-string
