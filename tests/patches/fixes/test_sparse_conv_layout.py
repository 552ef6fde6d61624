"""patches/fixes/sparse_conv_layout.py: sparse-conv checkpoints load into either backend.

Each side runs in a process of its own (``sparse_encoder_io``): the mmcv side with spconv
hidden, as on a machine without it. mmcv-trained weights loaded into spconv and
spconv-trained weights loaded into mmcv equal the source weights in the target layout;
a spconv checkpoint without module metadata loads into spconv unpermuted; on CUDA the
two backends' encoders then give the same output.
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmdet3d_scaling.models.bevfusion.sparse_backend import to_layout
from tests.devices import DEVICES

ROOT = Path(__file__).resolve().parents[3]
has_spconv = importlib.util.find_spec('spconv') is not None
needs_spconv = pytest.mark.skipif(not has_spconv, reason='needs spconv 2.x')
pytestmark = [pytest.mark.slow, needs_spconv]


def _side(tmp_path: Path, backend: str, model: str, tag: str, load: Path = None,
          strip: bool = False, forward: bool = False):
    save = tmp_path / f'{tag}.pth'
    cmd = [sys.executable, '-m', 'tests.patches.fixes.sparse_encoder_io', '--backend',
           backend, '--model', model, '--save', str(save)]
    if load:
        cmd += ['--load', str(load)]
    if strip:
        cmd.append('--strip-metadata')
    out = tmp_path / f'{tag}_out.pth'
    if forward:
        cmd += ['--forward', str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return save, (out if forward else None)


def _is_conv_weight(key: str, value: torch.Tensor) -> bool:
    return key.endswith('weight') and value.dim() == 5


def _assert_same_in_layout(src: dict, dst: dict, src_layout: str, dst_layout: str):
    assert list(src) == list(dst)
    convs = 0
    for key, value in src.items():
        if _is_conv_weight(key, value):
            value = to_layout(value, src_layout, dst_layout)
            convs += 1
        assert torch.equal(value, dst[key]), key
    assert convs >= 5


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('model', ['second', 'basicblock', 'bevfusion'])
@pytest.mark.parametrize('direction', ['mmcv->spconv', 'spconv->mmcv'])
def test_checkpoint_loads_into_the_other_backend(tmp_path, model, direction, device):
    """The weights in the other layout everywhere; on CUDA (``-m cuda`` selects it) also
    the same output of both backends' encoders (mmcv's sparse conv has no CPU path)."""
    src, dst = direction.split('->')
    cuda = device == 'cuda'
    saved, src_out = _side(tmp_path, src, model, 'src', forward=cuda)
    loaded, dst_out = _side(tmp_path, dst, model, 'dst', load=saved, forward=cuda)
    _assert_same_in_layout(torch.load(saved), torch.load(loaded), src, dst)
    if cuda:  # the same function on either backend
        torch.testing.assert_close(torch.load(dst_out), torch.load(src_out), rtol=1e-4,
                                   atol=1e-4)


def test_spconv_checkpoint_without_metadata_loads_unpermuted(tmp_path):
    """mmdet3d's own loader permutes it (no version 2 in the metadata)."""
    saved, _ = _side(tmp_path, 'spconv', 'second', 'src')
    loaded, _ = _side(tmp_path, 'spconv', 'second', 'dst', load=saved, strip=True)
    _assert_same_in_layout(torch.load(saved), torch.load(loaded), 'spconv', 'spconv')
