"""``float32_matmul_precision`` config key: let fp32 matrix products use TF32 / bf16.

PyTorch keeps fp32 ``matmul`` / ``mm`` on full-precision kernels by default (cuDNN
convolutions already use TF32). mmcv's sparse convolutions and the point / RoI heads of
3D detectors are built on ``mm``, so on Ampere and newer GPUs allowing TF32 there speeds
fp32 training up without touching the model. The value is PyTorch's own
(:func:`torch.set_float32_matmul_precision`): 'highest' (PyTorch's default), 'high'
(TF32) or 'medium' (bf16 products). This step only checks the value; the runner sets it
for its build and each command and restores torch's setting after each
(``engine/run_settings.py``).
"""
from typing import Optional

from mmengine.config import Config

PRECISIONS = ('highest', 'high', 'medium')


def check_matmul_precision(cfg: Config) -> Optional[str]:
    """``cfg.float32_matmul_precision``, checked (None when absent)."""
    value = cfg.get('float32_matmul_precision')
    if value is not None and value not in PRECISIONS:
        raise ValueError(
            f'float32_matmul_precision={value!r} is not one of {PRECISIONS}: use '
            "'high' for TF32 matrix products, 'highest' for PyTorch's full-precision "
            'default, or remove the key.')
    return value
