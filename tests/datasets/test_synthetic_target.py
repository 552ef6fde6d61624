"""Synthetic-data writers refuse non-empty folders and mark the folders they write."""
import json
import os
import os.path as osp
import warnings

import numpy as np
import pytest

from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
from mmdet3d_scaling.datasets.synthetic.nuscenes import (NuScenesSyntheticConfig,
                                                         generate_nuscenes)
from mmdet3d_scaling.datasets.synthetic.target import (TargetNotEmptyError,
                                                       holds_foreign_data, synthetic_kind)


def _real_folder(path) -> dict:
    """A folder of 'real' files; returns name -> bytes to compare afterwards."""
    os.makedirs(path / 'training' / 'velodyne')
    files = {f'{i:06d}.bin': np.arange(8, dtype=np.float32).tobytes() for i in range(7)}
    for name, data in files.items():
        (path / name).write_bytes(data)
    return files


def _contents(path) -> dict:
    return {n: (path / n).read_bytes() for n in os.listdir(path) if (path / n).is_file()}


def _nus(out, **kw) -> NuScenesSyntheticConfig:
    return NuScenesSyntheticConfig(out_dir=str(out), train_frames=1, val_frames=1,
                                   samples_per_scene=1, sweeps=0, image_size=(32, 64),
                                   objects_per_sample=2, clutter_per_sample=0,
                                   gt_database=False, **kw)


@pytest.mark.parametrize('writer', ['kitti', 'nuscenes'])
def test_writers_refuse_a_non_empty_folder(tmp_path, writer):
    before = _real_folder(tmp_path)
    with pytest.raises(TargetNotEmptyError) as err:
        if writer == 'kitti':
            write_kitti(str(tmp_path), 1, 1, progress=False)
        else:
            generate_nuscenes(_nus(tmp_path), progress=False)
    msg = str(err.value)
    assert isinstance(err.value, FileExistsError)
    assert repr(str(tmp_path)) in msg
    assert '8 entries: 000000.bin, 000001.bin, 000002.bin, 000003.bin, 000004.bin, ...' in msg
    assert f'no generator marker (.synthetic_{writer})' in msg and '--overwrite' in msg
    assert _contents(tmp_path) == before and sorted(os.listdir(tmp_path)) == sorted(
        [*before, 'training'])  # nothing written, not even the marker


def test_overwrite_writes_and_marks(tmp_path):
    before = _real_folder(tmp_path)
    write_kitti(str(tmp_path), 1, 1, progress=False, overwrite=True)
    assert synthetic_kind(str(tmp_path)) == 'kitti'
    assert (tmp_path / '000006.bin').read_bytes() == before['000006.bin']  # others kept
    record = json.loads((tmp_path / '.synthetic_kitti').read_text())
    assert record['dataset'] == 'kitti' and record['arguments']['seed'] == 0


def test_marker_names_the_generator_in_the_refusal(tmp_path):
    out = tmp_path / 'nus'
    generate_nuscenes(_nus(out), progress=False)
    assert synthetic_kind(str(out)) == 'nuscenes' and not holds_foreign_data(str(out))
    with pytest.raises(TargetNotEmptyError, match=r'written by this generator before '
                       r'\(.synthetic_nuscenes is there\)'):
        generate_nuscenes(_nus(out), progress=False)
    generate_nuscenes(_nus(out, overwrite=True), progress=False)


def test_empty_folder_and_file_target(tmp_path):
    (tmp_path / 'empty').mkdir()
    write_kitti(str(tmp_path / 'empty'), 1, 1, progress=False)
    assert osp.isfile(tmp_path / 'empty' / 'kitti_infos_train.pkl')
    (tmp_path / 'file').write_text('x')
    with pytest.raises(NotADirectoryError, match='is a file'):
        write_kitti(str(tmp_path / 'file'), 1, 1, progress=False)


def test_renderers_use_no_2d_cross_product():
    """numpy 2.5 removed np.cross of 2-vectors (deprecated in 2.0): the renderers'
    cross products are of 3-vectors; this fails if one becomes 2-D."""
    from mmdet3d_scaling.datasets.synthetic.kitti import KittiCalib, KittiSceneConfig, _CLASS_BGR
    from mmdet3d_scaling.datasets.synthetic.camera import render_image
    from mmdet3d_scaling.datasets.synthetic.nuscenes_sensors import (camera_models,
                                                                      render_camera)
    from mmdet3d_scaling.datasets.synthetic.scene import KITTI_CLASSES, sample_scene
    calib, cfg = KittiCalib(), KittiSceneConfig()
    with warnings.catch_warnings():
        warnings.filterwarnings('error', message='.*2-dimensional vectors.*')
        rng = np.random.default_rng(0)
        scene = sample_scene(rng, KITTI_CLASSES, 6, area=cfg.area, fov_deg=cfg.fov_deg)
        img = render_image(scene, calib.lidar2img(2), (calib.height, calib.width),
                           _CLASS_BGR, calib.lidar2cam)
        cam = camera_models(64, 128)[0]
        boxes = np.array([[10.0, 0.0, 0.0, 4.0, 2.0, 1.5, 0.3]])
        out = render_camera(rng, cam, np.linalg.inv(cam.cam2ego), boxes,
                            np.array([[200.0, 30.0, 30.0]]), np.array([0.0, 0.0, 1.0]))
    assert img.shape == (375, 1242, 3) and out.shape == (64, 128, 3)
    with pytest.warns(DeprecationWarning, match='2-dimensional'):  # what the filter catches
        np.cross(np.ones(2), np.ones(2))
