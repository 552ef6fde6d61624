"""``float32_matmul_precision`` config key: let fp32 matrix products use TF32 / bf16.

PyTorch keeps fp32 ``matmul`` / ``mm`` on full-precision kernels by default (cuDNN
convolutions already use TF32). mmcv's sparse convolutions and the point / RoI heads of
3D detectors are built on ``mm``, so on Ampere and newer GPUs allowing TF32 there speeds
fp32 training up without touching the model. The value is PyTorch's own
(:func:`torch.set_float32_matmul_precision`): 'highest' (PyTorch's default), 'high'
(TF32) or 'medium' (bf16 products).
"""
import torch
from mmengine.config import Config
from mmengine.logging import print_log

PRECISIONS = ('highest', 'high', 'medium')


def configure_matmul_precision(cfg: Config) -> None:
    """Apply ``cfg.float32_matmul_precision`` to this process (absent: no change)."""
    value = cfg.get('float32_matmul_precision')
    if value is None:
        return
    if value not in PRECISIONS:
        raise ValueError(
            f'float32_matmul_precision={value!r} is not one of {PRECISIONS}: use '
            "'high' for TF32 matrix products, 'highest' for PyTorch's full-precision "
            'default, or remove the key.')
    if torch.get_float32_matmul_precision() != value:
        torch.set_float32_matmul_precision(value)
        print_log(f'float32 matmul precision: {value!r} (torch.set_float32_matmul_'
                  'precision)', logger='current')
