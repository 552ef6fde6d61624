"""Fingerprint of a synthetic KITTI set: the same data gives the same hashes on any machine.

Hashed is the content, not the file encodings: point clouds as little-endian float32,
label / calib / plane files as text, images as decoded pixels (PNG encoders may compress
the same pixels differently), info files as the arrays and values they hold, in a fixed
order. ``tools/analysis/synthetic_fingerprint.py`` prints it;
``tests/datasets/test_synthetic_fingerprint.py`` pins it.
"""
import hashlib
import os
import os.path as osp
import pickle
import tempfile
from typing import Dict

import numpy as np

__all__ = ['fingerprint', 'generate_and_fingerprint']


def _canonical(value, digest) -> None:
    """Feed ``value`` (nested dicts / lists / arrays / scalars) to ``digest`` in a fixed
    order and encoding."""
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            digest.update(f'k{key!s}'.encode())
            _canonical(value[key], digest)
    elif isinstance(value, (list, tuple)):
        digest.update(f'l{len(value)}'.encode())
        for item in value:
            _canonical(item, digest)
    elif isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        digest.update(f'a{array.dtype.str}{array.shape}'.encode())
        digest.update(array.astype(array.dtype.newbyteorder('<')).tobytes())
    elif isinstance(value, (bool, np.bool_)):
        digest.update(b'b1' if value else b'b0')
    elif isinstance(value, (int, np.integer)):
        digest.update(f'i{int(value)}'.encode())
    elif isinstance(value, (float, np.floating)):
        digest.update(b'f' + np.float64(value).astype('<f8').tobytes())
    elif isinstance(value, str) or value is None:
        digest.update(f's{value}'.encode())
    else:
        raise TypeError(f'no canonical form for {type(value).__name__}: {value!r}')


def fingerprint(root: str) -> Dict[str, str]:
    """SHA-256 per content kind of the synthetic KITTI set at ``root``, and ``all``."""
    import cv2
    kinds = {k: hashlib.sha256() for k in ('points', 'labels', 'calib', 'images', 'infos')}
    training = osp.join(root, 'training')
    for sub, kind in (('velodyne', 'points'), ('velodyne_reduced', 'points'),
                      ('label_2', 'labels'), ('planes', 'labels'), ('calib', 'calib'),
                      ('image_2', 'images')):
        for name in sorted(os.listdir(osp.join(training, sub))):
            path = osp.join(training, sub, name)
            kinds[kind].update(f'{sub}/{name}'.encode())
            if kind == 'points':
                kinds[kind].update(np.fromfile(path, '<f4').tobytes())
            elif kind == 'images':
                kinds[kind].update(cv2.imread(path, cv2.IMREAD_UNCHANGED).tobytes())
            else:
                kinds[kind].update(open(path, 'rb').read())
    for name in sorted(n for n in os.listdir(root) if n.endswith('.pkl')):
        with open(osp.join(root, name), 'rb') as f:
            _canonical({name: pickle.load(f)}, kinds['infos'])
    gt_db = osp.join(root, 'kitti_gt_database')
    if osp.isdir(gt_db):
        for name in sorted(os.listdir(gt_db)):
            kinds['points'].update(name.encode())
            kinds['points'].update(np.fromfile(osp.join(gt_db, name), '<f4').tobytes())
    result = {k: d.hexdigest() for k, d in kinds.items()}
    result['all'] = hashlib.sha256(''.join(result[k] for k in sorted(result)).encode()).hexdigest()
    return result


def generate_and_fingerprint(frames: int, seed: int, val_frames: int = 2) -> Dict[str, str]:
    """Write ``frames`` train + ``val_frames`` val frames of synthetic KITTI into a temp
    folder and fingerprint them."""
    from .kitti import write_kitti
    with tempfile.TemporaryDirectory() as tmp:
        root = osp.join(tmp, 'synthetic_kitti')
        write_kitti(root, frames, val_frames, seed=seed, progress=False)
        return fingerprint(root)
