"""Camera images decoded on the model's device (``decode='gpu'``).

In that mode :class:`BEVLoadMultiViewImageFromFiles` keeps each camera's JPEG bytes,
:class:`ImageAug3D` and :class:`GridMask` only draw and record their parameters, and
the data preprocessor (main process, on the model's device) decodes the whole batch
and applies the recorded geometry there, as the PIL path would have done in the
loader worker: an antialiased bicubic resize, a crop (zero fill outside), a horizontal
flip and a nearest-neighbour rotation about the crop centre, in PIL's own arithmetic.

A sample's images travel as one *packet*, a ``uint8`` array of shape ``(L, 1, 1)``
in ``results['img']``, so that mmdet3d's stock ``Pack3DDetInputs`` passes it through
unchanged (as a ``(1, L, 1)`` tensor):

``MAGIC (8 bytes) | header length (uint32, little endian) | JSON header | payload``

The header names the files, their decoded sizes, each JPEG's byte range in the
payload, the augmentation parameters and GridMask's masks (their bytes in the
payload). Nothing here touches CUDA unless asked to by the device argument: the
transforms run in forked loader workers.
"""
import io
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

MAGIC = b'MMD3DJPG'
_HEAD = len(MAGIC) + 4
_EXIF_ORIENTATION = 0x0112
DECODE_MODES = ('cpu', 'gpu')


# ---------------------------------------------------------------- loader side


def jpeg_size(data: bytes, path: str) -> Tuple[int, int]:
    """``(height, width)`` of a JPEG from its header alone (no pixel decoding).

    Raises ``ValueError`` naming ``path`` for anything the device decoder would not
    read as the PIL path does: not a JPEG, CMYK or other modes, an EXIF rotation.
    """
    try:
        img = Image.open(io.BytesIO(data))
    except Exception as exc:  # PIL's own error types vary by format
        raise ValueError(f"decode='gpu': cannot read {path} as an image ({exc}); "
                         "use decode='cpu' for it.") from exc
    if img.format != 'JPEG':
        raise ValueError(f"decode='gpu' decodes JPEG only, but {path} is "
                         f'{img.format or "not a known format"}; use '
                         "decode='cpu' for these images.")
    if img.mode not in ('RGB', 'L'):
        raise ValueError(f"decode='gpu': {path} is a {img.mode} JPEG; the device "
                         "decoder reads RGB and grayscale ones. Use decode='cpu'.")
    orientation = img.getexif().get(_EXIF_ORIENTATION, 1)
    if orientation not in (0, 1):
        raise ValueError(f"decode='gpu': {path} has EXIF orientation {orientation}, "
                         "which the PIL path applies and the device decoder does not; "
                         "use decode='cpu'.")
    return img.height, img.width


@dataclass
class CameraAug:
    """One camera's :class:`ImageAug3D` draw (pixels of the resized image)."""
    resize: float
    dims: Tuple[int, int]  # (newW, newH)
    crop: Tuple[int, int, int, int]  # (x0, y0, x1, y1)
    flip: bool
    rotate: float  # degrees, counter-clockwise (PIL's Image.rotate)


@dataclass
class DeferredImages:
    """A sample's undecoded camera images and the pixel operations recorded for them.

    Args:
        paths: the image files, in camera order.
        sizes: ``(height, width)`` of each decoded image, pixels.
        jpegs: each camera's JPEG bytes.
        aug: one :class:`CameraAug` per camera once :class:`ImageAug3D` ran, else None.
        final_dim: ``(H, W)`` after augmentation, pixels; None before it.
        masks: GridMask applications in order: ``(mask, offset or None)``, each
            ``H x W`` float32.
    """
    paths: List[str]
    sizes: List[Tuple[int, int]]
    jpegs: List[bytes]
    aug: Optional[List[CameraAug]] = None
    final_dim: Optional[Tuple[int, int]] = None
    masks: List[Tuple[np.ndarray, Optional[np.ndarray]]] = field(default_factory=list)

    @property
    def pad_shape(self) -> Tuple[int, int]:
        """The sample's common size: the largest height and width (zero padding)."""
        return (max(h for h, _ in self.sizes), max(w for _, w in self.sizes))

    @property
    def shape(self) -> Tuple[int, int]:
        """``(H, W)`` of the images the preprocessor will produce."""
        return self.final_dim if self.final_dim is not None else self.pad_shape

    # ------------------------------------------------------------- packet

    def to_array(self) -> np.ndarray:
        """The packet, ``uint8`` of shape ``(L, 1, 1)``."""
        chunks: List[bytes] = []
        offset = 0

        def put(blob: bytes) -> List[int]:
            nonlocal offset
            chunks.append(blob)
            offset += len(blob)
            return [offset - len(blob), len(blob)]

        header: Dict = dict(v=1, paths=self.paths, sizes=[list(s) for s in self.sizes],
                            jpegs=[put(j) for j in self.jpegs])
        if self.aug is not None:
            header['aug'] = [dict(resize=a.resize, dims=list(a.dims), crop=list(a.crop),
                                  flip=a.flip, rotate=a.rotate) for a in self.aug]
            header['final_dim'] = list(self.final_dim)
        header['masks'] = [
            dict(shape=list(m.shape), mask=put(m.astype(np.float32).tobytes()),
                 offset=None if o is None else put(o.astype(np.float32).tobytes()))
            for m, o in self.masks]
        text = json.dumps(header).encode()
        packet = bytearray(MAGIC)  # mutable: torch.from_numpy wants a writable array
        for chunk in [struct.pack('<I', len(text)), text, *chunks]:
            packet += chunk
        return np.frombuffer(packet, dtype=np.uint8).reshape(-1, 1, 1)

    @classmethod
    def from_array(cls, packet: Union[np.ndarray, torch.Tensor]) -> 'DeferredImages':
        """Parse a packet made by :meth:`to_array` (array or CPU tensor, any shape)."""
        if isinstance(packet, torch.Tensor):
            packet = packet.detach().cpu().numpy()
        raw = np.ascontiguousarray(packet).reshape(-1).tobytes()
        if raw[:len(MAGIC)] != MAGIC:
            raise ValueError('not a deferred-image packet')
        (length, ) = struct.unpack('<I', raw[len(MAGIC):_HEAD])
        header = json.loads(raw[_HEAD:_HEAD + length])
        payload = memoryview(raw)[_HEAD + length:]

        def get(span: List[int]) -> memoryview:
            return payload[span[0]:span[0] + span[1]]

        aug = None
        if 'aug' in header:
            aug = [CameraAug(a['resize'], tuple(a['dims']), tuple(a['crop']), a['flip'],
                             a['rotate']) for a in header['aug']]
        masks = []
        for m in header['masks']:
            mask = np.frombuffer(get(m['mask']), np.float32).reshape(m['shape'])
            offset = (None if m['offset'] is None else
                      np.frombuffer(get(m['offset']), np.float32).reshape(m['shape']))
            masks.append((mask, offset))
        return cls(paths=header['paths'], sizes=[tuple(s) for s in header['sizes']],
                   jpegs=[bytes(get(span)) for span in header['jpegs']], aug=aug,
                   final_dim=tuple(header['final_dim']) if aug is not None else None,
                   masks=masks)


def is_packet(img) -> bool:
    """Whether ``img`` (array or tensor) is a deferred-image packet."""
    if isinstance(img, torch.Tensor):
        if img.dtype != torch.uint8 or img.numel() < _HEAD or img.device.type != 'cpu':
            return False
        head = img.reshape(-1)[:len(MAGIC)].numpy().tobytes()
    elif isinstance(img, np.ndarray):
        if img.dtype != np.uint8 or img.size < _HEAD or img.ndim != 3:
            return False
        head = img.reshape(-1)[:len(MAGIC)].tobytes()
    else:
        return False
    return head == MAGIC


def deferred_from_results(results: dict) -> Optional[DeferredImages]:
    """The sample's :class:`DeferredImages` when its images are deferred, else None."""
    img = results.get('img')
    return DeferredImages.from_array(img) if is_packet(img) else None


# ---------------------------------------------------------------- device side


def pil_rotate_fixed(angle: float, width: int, height: int) -> Optional[Tuple[int, ...]]:
    """PIL's ``Image.rotate(angle)`` (NEAREST, about the centre) as 16.16 fixed-point
    coefficients ``(a0, a1, a2, a3, a4, a5)``: the source pixel of output pixel
    ``(x, y)`` is ``((a2 + x*a0 + y*a1) >> 16, (a5 + x*a3 + y*a4) >> 16)``.

    None for the identity (PIL copies the image when ``angle % 360 == 0``). Follows
    Pillow's ``Image.rotate`` and ``affine_fixed`` (Geometry.c) operation by operation,
    so the chosen source pixels are PIL's.
    """
    angle = angle % 360.0
    if angle == 0:
        return None
    rad = -math.radians(angle)
    a, b = round(math.cos(rad), 15), round(math.sin(rad), 15)
    d, e = round(-math.sin(rad), 15), round(math.cos(rad), 15)
    cx, cy = width / 2, height / 2
    c = a * -cx + b * -cy + 0.0 + cx
    f = d * -cx + e * -cy + 0.0 + cy

    def fix(v: float) -> int:
        return math.floor(v * 65536.0 + 0.5)

    return (fix(a), fix(b), fix(c + a * 0.5 + b * 0.5), fix(d), fix(e),
            fix(f + d * 0.5 + e * 0.5))


def resize_like_pil(img: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """PIL's default ``Image.resize`` (antialiased bicubic) of ``C x H x W`` pixels.

    Two passes as Pillow does them, width first, each rounded and clipped to
    ``[0, 255]`` as Pillow's 8-bit intermediate. Returns float32 holding integers.
    """
    x = img[None].float()
    if x.shape[-1] != width:
        x = F.interpolate(x, size=(x.shape[-2], width), mode='bicubic', antialias=True,
                          align_corners=False).round_().clamp_(0, 255)
    if x.shape[-2] != height:
        x = F.interpolate(x, size=(height, width), mode='bicubic', antialias=True,
                          align_corners=False).round_().clamp_(0, 255)
    return x[0]


def _source_pixels(aug: Sequence[CameraAug], final_dim: Tuple[int, int],
                   device: torch.device) -> Tuple[torch.Tensor, ...]:
    """For every output pixel of every camera, the resized-image pixel it copies.

    Composes (in reverse) PIL's rotate (fixed point), flip and crop. Returns ``xs``,
    ``ys`` (int64, ``M x H x W``) and ``valid`` (bool: False where PIL fills zeros).
    """
    fh, fw = final_dim
    rows = []
    for a in aug:
        coef = pil_rotate_fixed(a.rotate, fw, fh)
        identity = coef is None
        coef = coef or (0, 0, 0, 0, 0, 0)
        rows.append([*coef, int(identity), int(a.flip), a.crop[0], a.crop[1],
                     a.dims[0], a.dims[1]])
    p = torch.tensor(rows, dtype=torch.int64, device=device)[:, :, None, None]
    y = torch.arange(fh, device=device, dtype=torch.int64)[None, :, None]
    x = torch.arange(fw, device=device, dtype=torch.int64)[None, None, :]
    a0, a1, a2, a3, a4, a5, identity, flip, crop_x, crop_y, new_w, new_h = p.unbind(1)
    rx = torch.where(identity.bool(), x, (a2 + x * a0 + y * a1) >> 16)
    ry = torch.where(identity.bool(), y, (a5 + x * a3 + y * a4) >> 16)
    valid = (rx >= 0) & (rx < fw) & (ry >= 0) & (ry < fh)  # inside the rotated crop
    rx = torch.where(flip.bool(), fw - 1 - rx, rx)
    xs, ys = rx + crop_x, ry + crop_y
    valid &= (xs >= 0) & (xs < new_w) & (ys >= 0) & (ys < new_h)  # inside the image
    return xs, ys, valid


def augment_like_pil(images: Sequence[torch.Tensor], aug: Sequence[CameraAug],
                     final_dim: Tuple[int, int]) -> torch.Tensor:
    """:class:`ImageAug3D`'s PIL pixel operations on the device.

    Args:
        images: one ``3 x H x W`` image per camera (uint8 or float, one device).
        aug: each camera's recorded draw.
        final_dim: output ``(H, W)``, pixels.

    Returns:
        ``M x 3 x H x W`` float32 with integer values in ``[0, 255]``.
    """
    device = images[0].device
    resized = [resize_like_pil(img, a.dims[1], a.dims[0]) for img, a in zip(images, aug)]
    hmax = max(r.shape[-2] for r in resized)
    wmax = max(r.shape[-1] for r in resized)
    buf = resized[0].new_zeros(len(resized), resized[0].shape[0], hmax, wmax)
    for i, r in enumerate(resized):
        buf[i, :, :r.shape[-2], :r.shape[-1]] = r
    xs, ys, valid = _source_pixels(aug, final_dim, device)
    index = (ys.clamp(0, hmax - 1) * wmax + xs.clamp(0, wmax - 1)).flatten(1)
    out = buf.flatten(2).gather(2, index[:, None].expand(-1, buf.shape[1], -1))
    out = out.view(len(resized), buf.shape[1], *final_dim)
    return out * valid[:, None].to(out.dtype)


def pad_to(img: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Zero-pad ``C x h x w`` at the bottom and right (as ``mmcv.impad``)."""
    return F.pad(img, (0, width - img.shape[-1], 0, height - img.shape[-2]))


def apply_masks(imgs: torch.Tensor,
                masks: Sequence[Tuple[np.ndarray, Optional[np.ndarray]]]) -> torch.Tensor:
    """GridMask's recorded ``x * mask (+ offset)`` on ``N x C x H x W`` images."""
    for mask, offset in masks:
        imgs = imgs * imgs.new_tensor(mask)
        if offset is not None:
            imgs = imgs + imgs.new_tensor(offset)
    return imgs
