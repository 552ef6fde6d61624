"""BEVFusion's data preprocessor: ``Det3DDataPreprocessor`` that also decodes camera
JPEGs on the model's device when the pipeline deferred them
(``BEVLoadMultiViewImageFromFiles(decode='gpu')``), and in training keeps the
loader's ground truth on the host for the heatmap targets (:mod:`.host_ground_truth`).

Batches with decoded images (``decode='cpu'``, the default) go straight to
``Det3DDataPreprocessor``: same code, same numbers (plus that one metainfo key).
"""
from typing import Callable, List, Optional, Sequence

import mmcv
import numpy as np
import torch
from mmengine.logging import print_log
from torch import Tensor

from mmdet3d.models.data_preprocessors import Det3DDataPreprocessor
from mmdet3d.registry import MODELS
from mmdet3d_scaling.datasets.transforms.deferred_images import (DeferredImages,
                                                                 apply_masks,
                                                                 augment_like_pil,
                                                                 is_packet, pad_to)
from mmdet3d_scaling.registry import register
from .host_ground_truth import keep_host_ground_truth

JPEG_DECODERS = ('auto', 'torchvision', 'pil')
_MIN_TORCHVISION = (0, 19)  # decode_jpeg(list, device=...): batched, nvJPEG on CUDA


def torchvision_decode_jpeg() -> Callable:
    """``torchvision.io.decode_jpeg`` with batched device decoding, or ImportError
    saying what is missing."""
    try:
        import torchvision
        from torchvision.io import decode_jpeg
    except Exception as exc:  # ImportError, or a torchvision built for another torch
        raise ImportError(
            f"decode='gpu' decodes with torchvision.io.decode_jpeg, but torchvision "
            f'does not import here ({type(exc).__name__}: {exc}). Install the '
            "torchvision that matches your torch, or use decode='cpu'.") from exc
    version = tuple(int(p) for p in torchvision.__version__.split('+')[0].split('.')[:2])
    if version < _MIN_TORCHVISION:
        raise ImportError(
            f'torchvision {torchvision.__version__}: decode_jpeg has no batched device '
            f"decoding before {'.'.join(map(str, _MIN_TORCHVISION))}; upgrade "
            "torchvision or use decode='cpu'.")
    return decode_jpeg


@register(MODELS)
class BEVFusionDataPreprocessor(Det3DDataPreprocessor):
    """``Det3DDataPreprocessor`` plus on-device decoding of deferred camera JPEGs.

    BEVFusion builds this class when its config says ``Det3DDataPreprocessor``.
    A batch whose ``inputs['img']`` holds deferred packets is decoded in one batched
    call on this module's device, each camera padded, augmented (the PIL path's
    resize / crop / flip / rotate as recorded by ``ImageAug3D``) and masked
    (``GridMask``) there; then normalisation and stacking run as for decoded images.
    In training each sample's host ground truth is kept in its metainfo
    (:mod:`.host_ground_truth`), so the heatmap targets need no copy back.

    Args: as :class:`mmdet3d.models.data_preprocessors.Det3DDataPreprocessor`, plus
        jpeg_decoder: ``'auto'`` (default): ``torchvision.io.decode_jpeg`` (nvJPEG on
            CUDA); on the CPU, PIL where torchvision does not import. ``'torchvision'``:
            that decoder or an error. ``'pil'``: PIL in the main process, then a copy
            to the device (the CPU path's decoder, for comparisons).
    """

    def __init__(self, *args, jpeg_decoder: str = 'auto', **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if jpeg_decoder not in JPEG_DECODERS:
            raise ValueError(f'BEVFusionDataPreprocessor: jpeg_decoder={jpeg_decoder!r}; '
                             f'use one of {JPEG_DECODERS}.')
        self.jpeg_decoder = jpeg_decoder
        self._decoder: Optional[str] = None  # resolved at the first deferred batch

    # ------------------------------------------------------------------ entry

    def simple_process(self, data: dict, training: bool = False) -> dict:
        if training and data.get('data_samples'):
            keep_host_ground_truth(data['data_samples'])
        imgs = data['inputs'].get('img')
        if isinstance(imgs, (list, tuple)) and any(is_packet(i) for i in imgs):
            if not all(is_packet(i) for i in imgs):
                raise ValueError('BEVFusionDataPreprocessor: a batch mixes deferred '
                                 "(decode='gpu') and decoded images; use one decode "
                                 'mode for the whole dataset.')
            data = dict(data, inputs=dict(data['inputs']))
            data['inputs']['img'] = self.decode_deferred(imgs)
        return super().simple_process(data, training)

    # ------------------------------------------------------------------ decoding

    @property
    def _announced(self) -> bool:
        """Whether the decoder was chosen (and logged) at a first deferred batch."""
        return self._decoder is not None

    @property
    def device(self) -> torch.device:
        return torch.device(self._device)

    def _backend(self) -> str:
        if self.jpeg_decoder != 'auto':
            return self.jpeg_decoder
        if self.device.type == 'cpu':
            try:
                torchvision_decode_jpeg()
            except ImportError:
                return 'pil'
        return 'torchvision'

    def decode_jpegs(self, jpegs: Sequence[bytes], paths: Sequence[str]) -> List[Tensor]:
        """Decode JPEG bytes to ``3 x H x W`` uint8 RGB tensors on :attr:`device`."""
        if self._decoder is None:  # once: the import probe is not per-batch work
            self._decoder = self._backend()
            print_log(f"BEVFusionDataPreprocessor: decoding deferred camera JPEGs "
                      f"(decode='gpu') with {self._decoder} on {self.device}.",
                      logger='current')
        backend = self._decoder
        if backend == 'pil':
            return [torch.from_numpy(mmcv.imfrombytes(
                j, flag='color', backend='pillow', channel_order='rgb')).permute(
                    2, 0, 1).to(self.device) for j in jpegs]
        decode_jpeg = torchvision_decode_jpeg()
        from torchvision.io import ImageReadMode
        data = [torch.from_numpy(np.frombuffer(j, dtype=np.uint8).copy()) for j in jpegs]
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError as exc:
            bad = self._first_undecodable(decode_jpeg, data, paths)
            raise RuntimeError(f'torchvision.io.decode_jpeg on {self.device} failed'
                               f'{f" on {bad}" if bad else ""}: {exc}. Check the file, '
                               "or use decode='cpu'.") from exc

    def _first_undecodable(self, decode_jpeg, data, paths) -> Optional[str]:
        from torchvision.io import ImageReadMode
        for tensor, path in zip(data, paths):
            try:
                decode_jpeg([tensor], mode=ImageReadMode.RGB, device=self.device)
            except RuntimeError:
                return path
        return None

    def render(self, deferred: DeferredImages, decoded: Sequence[Tensor]) -> Tensor:
        """One sample's ``N x 3 x H x W`` float32 images from its decoded cameras."""
        height, width = deferred.pad_shape
        imgs = [img if tuple(img.shape[-2:]) == (height, width) else
                pad_to(img, height, width) for img in decoded]
        if deferred.aug is not None:
            out = augment_like_pil(imgs, deferred.aug, deferred.final_dim)
        else:
            out = torch.stack(imgs).float()
        return apply_masks(out, deferred.masks)

    def decode_deferred(self, packets: Sequence[Tensor]) -> List[Tensor]:
        """A batch of packets -> one ``N x 3 x H x W`` float32 tensor per sample."""
        samples = [DeferredImages.from_array(p) for p in packets]
        jpegs = [j for s in samples for j in s.jpegs]
        paths = [p for s in samples for p in s.paths]
        decoded = self.decode_jpegs(jpegs, paths)
        out, start = [], 0
        for sample in samples:
            views = decoded[start:start + len(sample.jpegs)]
            start += len(sample.jpegs)
            for img, path, size in zip(views, sample.paths, sample.sizes):
                if tuple(img.shape[-2:]) != tuple(size):
                    raise RuntimeError(f'{path}: decoded to {tuple(img.shape[-2:])}, its '
                                       f'header says {tuple(size)}.')
            out.append(self.render(sample, views))
        return out
