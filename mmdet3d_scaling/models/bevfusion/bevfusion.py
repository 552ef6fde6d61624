"""The BEVFusion detector (LiDAR-only or LiDAR-camera), config-compatible with
mmdet3d 1.4's ``projects/BEVFusion`` (type name ``BEVFusion``).

Pipeline: points -> hard voxelization (a sort) -> mean per voxel -> sparse encoder
-> BEV map; optionally images -> backbone -> neck -> view transform -> camera BEV map,
fused with the LiDAR map by ``fusion_layer``; then BEV backbone, neck and head.
"""
import copy
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.logging import print_log
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from mmdet3d.models import Base3DDetector
from mmdet3d.registry import MODELS
from mmdet3d.structures import Det3DDataSample
from mmdet3d.utils import OptConfigType, OptMultiConfig
from mmdet3d_scaling.registry import register
from ...utils.device_copy import to_device
from ..cuda_graphs import CudaGraphCache, several_ranks
from ..side_stream import SideStreams
from .data_preprocessor import BEVFusionDataPreprocessor  # noqa: F401  (registers)
from .voxelize import BEVFusionVoxelizer

CHECKPOINTABLE = ('img_backbone', 'img_neck', 'view_transform')
# Chains that model.cuda_graphs may name -> their modules, in call order.
GRAPHABLE = {'img_encoder': ('img_backbone', 'img_neck'),
             'bev_head': ('pts_backbone', 'pts_neck', 'bbox_head')}
# Camera geometry of each sample: meta key -> argument of the view transform.
_CAMERA_METAS = (('lidar2img', None), ('cam2img', None), ('cam2lidar', None),
                 ('img_aug_matrix', np.eye(4)), ('lidar_aug_matrix', np.eye(4)))


_STOCK_PREPROCESSORS = ('Det3DDataPreprocessor', 'mmdet3d.Det3DDataPreprocessor')


def _build(cfg: Optional[dict]):
    return MODELS.build(cfg) if cfg is not None else None


@register(MODELS)
class BEVFusion(Base3DDetector):
    """BEVFusion: multi-sensor 3D detection in a unified bird's-eye view.

    Args:
        data_preprocessor (dict): ``Det3DDataPreprocessor`` config holding
            ``voxelize_cfg`` (as upstream): max_num_points, point_cloud_range,
            voxel_size, max_voxels (train, test), voxelize_reduce, optionally
            deterministic. ``voxelize_cfg`` is taken out before the preprocessor is
            built; the config itself is not modified. ``Det3DDataPreprocessor`` is
            built as :class:`BEVFusionDataPreprocessor` (the same, plus decoding of
            camera JPEGs deferred by ``decode='gpu'``).
        pts_voxel_encoder (dict, optional): built for config compatibility; used only
            when ``voxelize_reduce=False`` (e.g. ``HardSimpleVFE``).
        pts_middle_encoder (dict): sparse encoder, e.g. ``BEVFusionSparseEncoder``.
        fusion_layer (dict, optional): fuses [camera BEV, LiDAR BEV], e.g. ConvFuser.
        img_backbone, img_neck, view_transform (dict, optional): camera branch; all
            three or none.
        pts_backbone, pts_neck (dict): BEV backbone and neck (SECOND, SECONDFPN).
        bbox_head (dict): ``TransFusionHead`` config.
        checkpoint_modules (sequence[str]): camera modules run with gradient
            checkpointing in training, any of 'img_backbone', 'img_neck',
            'view_transform'. Saves activation memory for recomputation time;
            BN running statistics of a checkpointed module are updated twice per
            step. Defaults to () (none).
        view_transform_fp32 (bool): run the view transform in fp32 under AMP, as
            upstream. Defaults to True.
        cuda_graphs (sequence[str]): chains run as CUDA graphs in training (forward
            and backward, one graph per input shape, see
            :mod:`mmdet3d_scaling.models.cuda_graphs`): 'img_encoder' (image backbone
            + neck at the fixed image size), 'bev_head' (BEV backbone, neck and the
            head's forward at the fixed BEV size; the head's loss runs eagerly). A chain runs eagerly while a module of
            it is checkpointed (``checkpoint_modules`` or a submodule's ``with_cp``,
            read at every call: the fastest fit switches checkpointing off and on),
            and the start-up line says so. Defaults to () (none).
        concurrent_branches (bool): run the LiDAR branch on a CUDA stream of its own
            (:mod:`mmdet3d_scaling.models.side_stream`), beside the camera branch on
            the current one, with CUDA inputs and cameras, in a single process (a
            process group of several ranks runs one stream); the same operations, so
            the same results up to the order of atomic additions. Defaults to False.
        init_cfg (dict, optional): init config.
    """

    def __init__(self,
                 data_preprocessor: OptConfigType = None,
                 pts_voxel_encoder: Optional[dict] = None,
                 pts_middle_encoder: Optional[dict] = None,
                 fusion_layer: Optional[dict] = None,
                 img_backbone: Optional[dict] = None,
                 pts_backbone: Optional[dict] = None,
                 view_transform: Optional[dict] = None,
                 img_neck: Optional[dict] = None,
                 pts_neck: Optional[dict] = None,
                 bbox_head: Optional[dict] = None,
                 init_cfg: OptMultiConfig = None,
                 seg_head: Optional[dict] = None,
                 checkpoint_modules: Sequence[str] = (),
                 view_transform_fp32: bool = True,
                 cuda_graphs: Sequence[str] = (),
                 concurrent_branches: bool = False,
                 **kwargs) -> None:
        data_preprocessor, voxelize_cfg = self._split_voxelize_cfg(data_preprocessor)
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        self._check_required(pts_middle_encoder=pts_middle_encoder,
                             pts_backbone=pts_backbone, pts_neck=pts_neck,
                             bbox_head=bbox_head)
        if seg_head is not None:
            raise ValueError('BEVFusion: seg_head is not supported (nor upstream); '
                             'remove it from the config.')
        self._check_camera(img_backbone, img_neck, view_transform)

        self.voxelize_reduce = voxelize_cfg['voxelize_reduce']
        self.pts_voxel_layer = BEVFusionVoxelizer(**voxelize_cfg)
        self.pts_voxel_encoder = _build(pts_voxel_encoder)
        self.img_backbone = _build(img_backbone)
        self.img_neck = _build(img_neck)
        self.view_transform = _build(view_transform)
        self.pts_middle_encoder = MODELS.build(pts_middle_encoder)
        self.fusion_layer = _build(fusion_layer)
        self.pts_backbone = MODELS.build(pts_backbone)
        self.pts_neck = MODELS.build(pts_neck)
        self.bbox_head = MODELS.build(bbox_head)

        unknown = set(checkpoint_modules) - set(CHECKPOINTABLE)
        if unknown:
            raise ValueError(f'checkpoint_modules={list(checkpoint_modules)}: '
                             f'{sorted(unknown)} not in {CHECKPOINTABLE}.')
        self.checkpoint_modules = tuple(checkpoint_modules)
        self.view_transform_fp32 = view_transform_fp32
        self._with_cp_modules: Dict[str, tuple] = {}
        self.cuda_graphs = self._graphed_chains(cuda_graphs)
        self._graph_cache = CudaGraphCache()
        self.concurrent_branches = bool(concurrent_branches)
        self._side_streams = SideStreams()
        if self.concurrent_branches:
            if self.img_backbone is None:
                raise ValueError('BEVFusion: concurrent_branches=True needs the camera '
                                 'branch (img_backbone, img_neck, view_transform); '
                                 'remove it for a LiDAR-only model.')
            print_log('BEVFusion: the LiDAR branch runs on a CUDA stream of its own, '
                      'beside the camera branch (model.concurrent_branches; one stream '
                      'under several ranks).',
                      logger='current')

    # ------------------------------------------------------------------ config

    @staticmethod
    def _split_voxelize_cfg(data_preprocessor):
        if data_preprocessor is None or 'voxelize_cfg' not in data_preprocessor:
            raise ValueError(
                'BEVFusion needs data_preprocessor=dict(type=\'Det3DDataPreprocessor\', '
                'voxelize_cfg=dict(max_num_points=..., point_cloud_range=..., '
                'voxel_size=..., max_voxels=[train, test], voxelize_reduce=True)).')
        data_preprocessor = copy.deepcopy(dict(data_preprocessor))
        voxelize_cfg = dict(data_preprocessor.pop('voxelize_cfg'))
        if data_preprocessor.get('type') in _STOCK_PREPROCESSORS:
            # Same class plus decoding of deferred camera JPEGs (decode='gpu');
            # decoded images take Det3DDataPreprocessor's own code.
            data_preprocessor['type'] = 'mmdet3d_scaling.BEVFusionDataPreprocessor'
        if 'voxelize_reduce' not in voxelize_cfg:
            raise ValueError('voxelize_cfg needs voxelize_reduce (True: mean of the '
                             'points of a voxel, as the official configs).')
        return data_preprocessor, voxelize_cfg

    @staticmethod
    def _check_required(**parts) -> None:
        missing = [name for name, cfg in parts.items() if cfg is None]
        if missing:
            raise ValueError(f'BEVFusion needs {", ".join(missing)} in the model config.')

    @staticmethod
    def _check_camera(img_backbone, img_neck, view_transform) -> None:
        given = [n for n, c in (('img_backbone', img_backbone), ('img_neck', img_neck),
                                ('view_transform', view_transform)) if c is not None]
        if given and len(given) != 3:
            raise ValueError(f'BEVFusion camera branch: got only {given}; give '
                             'img_backbone, img_neck and view_transform together, or '
                             'none of them for LiDAR-only.')

    def _graphed_chains(self, names: Sequence[str]) -> Tuple[str, ...]:
        """The chains of ``cuda_graphs`` this model has (said at start)."""
        names = tuple(names)
        unknown = set(names) - set(GRAPHABLE)
        if unknown:
            raise ValueError(f'cuda_graphs={list(names)}: {sorted(unknown)} not in '
                             f'{sorted(GRAPHABLE)}.')
        if 'bev_head' in names and not hasattr(self.bbox_head, 'loss_of_forward'):
            raise ValueError(f"cuda_graphs=['bev_head'] needs a head with loss_of_forward "
                             f'(mmdet3d_scaling.TransFusionHead); '
                             f'{type(self.bbox_head).__name__} has none: remove '
                             "'bev_head' from model.cuda_graphs.")
        kept = []
        for name in names:
            if getattr(self, GRAPHABLE[name][0]) is None:
                print_log(f'BEVFusion: cuda_graphs {name!r} runs eagerly: the model has '
                          'no camera branch.', logger='current')
                continue
            kept.append(name)
            if self._checkpointed(name):
                print_log(f'BEVFusion: cuda_graphs {name!r} runs eagerly while a module '
                          'of it is checkpointed (checkpoint_modules / with_cp): '
                          'checkpointing frees activations a graph would keep.',
                          logger='current')
        if kept:
            print_log(f'BEVFusion: CUDA graphs in training for {kept} (model.cuda_graphs):'
                      ' captured at the first training step of each input shape.',
                      logger='current')
        return tuple(kept)

    def _checkpointed(self, name: str) -> bool:
        """Whether a module of chain ``name`` is checkpointed now."""
        parts = GRAPHABLE[name]
        if set(parts) & set(self.checkpoint_modules):
            return True
        if name not in self._with_cp_modules:  # modules that have the flag, once
            self._with_cp_modules[name] = tuple(
                m for part in parts for m in getattr(self, part).modules()
                if isinstance(getattr(m, 'with_cp', None), bool))
        return any(m.with_cp for m in self._with_cp_modules[name])

    def runs_as_graph(self, name: str) -> bool:
        """Whether chain ``name`` runs as a CUDA graph in a training call now (on a
        CUDA input, one process)."""
        return name in self.cuda_graphs and not self._checkpointed(name)

    def init_weights(self) -> None:
        """As upstream: only the image backbone (pretrained weights) is initialised
        here; every other module keeps the initialisation it was built with."""
        if self.img_backbone is not None:
            self.img_backbone.init_weights()

    @property
    def with_bbox_head(self) -> bool:
        return getattr(self, 'bbox_head', None) is not None

    @property
    def with_seg_head(self) -> bool:
        return False

    # ------------------------------------------------------------------ features

    def _run(self, name: str, *args):
        """Call sub-module ``name``, with gradient checkpointing if configured."""
        module = getattr(self, name)
        if (name in self.checkpoint_modules and self.training
                and torch.is_grad_enabled()):
            return checkpoint(module, *args, use_reentrant=False)
        return module(*args)

    def extract_img_feat(self, imgs: Tensor, points: List[Tensor], lidar2image: Tensor,
                         camera_intrinsics: Tensor, camera2lidar: Tensor,
                         img_aug_matrix: Tensor, lidar_aug_matrix: Tensor,
                         img_metas: List[dict]) -> Tensor:
        """Camera BEV map from ``imgs`` ``[B, N, C, H, W]``."""
        batch, views = imgs.shape[:2]
        x = imgs.flatten(0, 1).contiguous()
        if self._graph_cache.applies(x, self.training) and self.runs_as_graph('img_encoder'):
            x = self._graph_cache.run('img_encoder', (self.img_backbone, self.img_neck), x)
        else:
            x = self._run('img_neck', self._run('img_backbone', x))
        if not isinstance(x, Tensor):
            x = x[0]
        x = x.view(batch, views, *x.shape[1:])
        args = (x, points, lidar2image, camera_intrinsics, camera2lidar, img_aug_matrix,
                lidar_aug_matrix, img_metas)
        if self.view_transform_fp32:
            with torch.autocast(device_type=x.device.type, enabled=False):
                args = tuple(a.float() if isinstance(a, Tensor) else a for a in args)
                return self._run('view_transform', *args)
        return self._run('view_transform', *args)

    def voxelize(self, points: List[Tensor]):
        """Voxels of a batch: features, (batch, x, y, z) indices, points per voxel."""
        return self.pts_voxel_layer(points)

    def extract_pts_feat(self, batch_inputs_dict: dict) -> Tensor:
        """LiDAR BEV map from ``batch_inputs_dict['points']``."""
        points = batch_inputs_dict.get('points')
        if not points:
            raise ValueError('BEVFusion needs points in the inputs (Pack3DDetInputs '
                             "keys=['points', ...]).")
        device_type = points[0].device.type
        with torch.autocast(device_type=device_type, enabled=False):
            feats, coords, sizes = self.voxelize([p.float() for p in points])
            if not self.voxelize_reduce:
                if self.pts_voxel_encoder is None:
                    raise ValueError('voxelize_reduce=False needs pts_voxel_encoder.')
                feats = self.pts_voxel_encoder(feats, sizes, coords)
        return self.pts_middle_encoder(feats, coords, len(points))

    def _camera_inputs(self, imgs: Tensor, metas: List[dict]) -> List[Tensor]:
        host = []
        for key, default in _CAMERA_METAS:
            values = []
            for i, meta in enumerate(metas):
                if key not in meta and default is None:
                    raise KeyError(f'BEVFusion camera branch: sample {i} has no {key!r} '
                                   'in its metainfo; add it to Pack3DDetInputs meta_keys.')
                values.append(meta.get(key, default))
            host.append(torch.as_tensor(np.asarray(values), dtype=imgs.dtype))
        # one pinned, non-blocking copy of all of them: a copy from pageable memory
        # waits for the GPU's queue (five waits a micro-batch before)
        flat = to_device(torch.cat([t.reshape(-1) for t in host]), imgs.device)
        return [part.view(t.shape) for part, t in
                zip(flat.split([t.numel() for t in host]), host)]

    def extract_bev(self, batch_inputs_dict: dict, batch_input_metas: List[dict]) -> Tensor:
        """The fused (or LiDAR-only) BEV map, before the BEV backbone."""
        imgs = batch_inputs_dict.get('imgs', None)
        camera = imgs is not None and self.img_backbone is not None
        if camera:
            imgs = imgs.contiguous()
            points = [p.clone() for p in batch_inputs_dict['points']]
        if camera and self.concurrent_branches and imgs.is_cuda and not several_ranks():
            # the camera branch queued first on this stream; the LiDAR branch on its
            # own stream from the same inputs: its waits (voxel counts, sparse-conv
            # indices) then wait for its own kernels while the camera's keep the GPU busy
            branch = self._side_streams.branch(imgs.device)
            img_feat = self._camera_feat(imgs, points, batch_input_metas)
            pts_feat = branch.run(lambda: self.extract_pts_feat(batch_inputs_dict),
                                  batch_inputs_dict['points'])
        else:
            # the LiDAR branch first: its host reads (voxel counts, sparse-conv indices)
            # then find a short GPU queue instead of waiting for the camera branch
            pts_feat = self.extract_pts_feat(batch_inputs_dict)
            img_feat = self._camera_feat(imgs, points, batch_input_metas) if camera else None
        features = [pts_feat] if img_feat is None else [img_feat, pts_feat]  # the fuser's order
        if self.fusion_layer is not None:
            return self.fusion_layer(features)
        if len(features) != 1:
            raise ValueError('BEVFusion got camera and LiDAR features but has no '
                             'fusion_layer to combine them.')
        return features[0]

    def extract_feat(self, batch_inputs_dict: dict, batch_input_metas: List[dict],
                     **kwargs):
        """Fused (or LiDAR-only) BEV features after the BEV backbone and neck."""
        return self._decode_bev(self.extract_bev(batch_inputs_dict, batch_input_metas))

    def _decode_bev(self, bev: Tensor):
        """The BEV backbone and neck on a BEV map."""
        return self.pts_neck(self.pts_backbone(bev))

    def _camera_feat(self, imgs: Tensor, points: List[Tensor], metas: List[dict]) -> Tensor:
        """The camera BEV map of ``imgs`` (contiguous) and a copy of the points."""
        return self.extract_img_feat(imgs, points, *self._camera_inputs(imgs, metas), metas)

    # ------------------------------------------------------------------ modes

    def loss(self, batch_inputs_dict: Dict[str, Optional[Tensor]],
             batch_data_samples: List[Det3DDataSample], **kwargs) -> dict:
        metas = [s.metainfo for s in batch_data_samples]
        # the heatmap targets need only the ground truth: drawn on the host while the
        # GPU runs the branches (a head without the hook draws them in its loss)
        start = getattr(self.bbox_head, 'start_heatmap_targets', None)
        heatmaps = start(batch_data_samples) if start is not None else None
        extra = {} if heatmaps is None else dict(heatmaps=heatmaps)
        bev = self.extract_bev(batch_inputs_dict, metas)
        if self._graph_cache.applies(bev, self.training) and self.runs_as_graph('bev_head'):
            chain = tuple(getattr(self, part) for part in GRAPHABLE['bev_head'])
            return dict(self.bbox_head.loss_of_forward(
                lambda: self._graph_cache.run('bev_head', chain, bev), batch_data_samples,
                **extra))
        return dict(self.bbox_head.loss(self._decode_bev(bev), batch_data_samples, **extra))

    def predict(self, batch_inputs_dict: Dict[str, Optional[Tensor]],
                batch_data_samples: List[Det3DDataSample],
                **kwargs) -> List[Det3DDataSample]:
        """Detections in ``pred_instances_3d`` (bboxes_3d, scores_3d, labels_3d)."""
        metas = [s.metainfo for s in batch_data_samples]
        feats = self.extract_feat(batch_inputs_dict, metas)
        outputs = self.bbox_head.predict(feats, metas)
        return self.add_pred_to_datasample(batch_data_samples, outputs)

    def _forward(self, batch_inputs_dict: dict,
                 batch_data_samples: Optional[List[Det3DDataSample]] = None, **kwargs):
        """Raw head outputs (``mode='tensor'``): ``([dict],)``."""
        metas = [s.metainfo for s in batch_data_samples] if batch_data_samples else []
        feats = self.extract_feat(batch_inputs_dict, metas)
        return self.bbox_head(feats, metas)
