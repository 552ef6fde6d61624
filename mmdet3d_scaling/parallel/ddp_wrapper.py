"""``ScalingDistributedDataParallel``: MMDistributedDataParallel plus SyncBN conversion,
the unused-parameter probe and gradient compression, all set from the config."""
from typing import Any, List, Optional, Sequence, Union

from mmengine.dist import get_rank
from mmengine.logging import print_log
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS
from torch import nn

from ..registry import register
from .sync_bn import convert_sync_bn, norm_layer_counts, resolve_implementation
from .unused_params import probe_unused_parameters

COMM_COMPRESSIONS = (None, 'fp16', 'bf16')


def comm_hook(compression: Optional[str]):
    """torch's gradient-compression DDP hook for 'fp16' / 'bf16'; None for none."""
    if compression not in COMM_COMPRESSIONS:
        raise ValueError(f'comm_compression={compression!r} is not one of None, '
                         "'fp16', 'bf16'")
    if compression is None:
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return {'fp16': default_hooks.fp16_compress_hook,
            'bf16': default_hooks.bf16_compress_hook}[compression]


# Registered in mmengine's root MODEL_WRAPPERS: Runner.wrap_model looks the type up there.
@register(MODEL_WRAPPERS)
class ScalingDistributedDataParallel(MMDistributedDataParallel):
    """MMDistributedDataParallel with the plugin's distributed options.

    Built by the Runner from ``model_wrapper_cfg``, which the ``distributed`` config step
    writes (see ``docs/scaling_guide.md``); all DDP arguments pass through.

    Args:
        module: the model, already on its device.
        find_unused_parameters: True / False as in DDP, or 'auto': run one training
            forward/backward on the first batch of ``probe_dataloader`` before wrapping,
            log the names of parameters without gradient (union over ranks) and turn the
            option on only if there are any. Defaults to False.
        sync_bn: None, 'torch', 'mmcv', 'naive' or 'allreduce': convert BatchNorm
            layers (sparse encoders included) before wrapping; without CUDA
            'torch'/'mmcv' fall back to 'naive'. Defaults to None.
        sync_bn_scope: with ``sync_bn``, convert only the layers inside these
            submodules (names as in ``model.named_modules()``); None: all. Defaults to
            None.
        comm_compression: None, 'fp16' or 'bf16': all-reduce gradients in half
            precision (torch's ``fp16_compress_hook`` / ``bf16_compress_hook``; bf16
            needs NCCL >= 2.9.6). Defaults to None.
        probe_dataloader: dataloader config for the 'auto' probe. Defaults to None.
        **kwargs: DDP / MMDistributedDataParallel arguments (``static_graph``,
            ``gradient_as_bucket_view``, ``bucket_cap_mb`` (MiB), ``broadcast_buffers``,
            ``device_ids``, ``detect_anomalous_params`` ...).
    """

    def __init__(self,
                 module: nn.Module,
                 find_unused_parameters: Union[bool, str] = False,
                 sync_bn: Optional[str] = None,
                 sync_bn_scope: Optional[Sequence[str]] = None,
                 comm_compression: Optional[str] = None,
                 probe_dataloader: Optional[dict] = None,
                 **kwargs: Any) -> None:
        hook = comm_hook(comm_compression)
        probed = None
        if find_unused_parameters == 'auto':
            probed = self._probe(module, probe_dataloader)
            find_unused_parameters = bool(probed)
        elif not isinstance(find_unused_parameters, bool):
            raise ValueError('find_unused_parameters must be True, False or "auto", got '
                             f'{find_unused_parameters!r}')
        if sync_bn is not None:
            module = convert_sync_bn(module, resolve_implementation(sync_bn),
                                     scope=sync_bn_scope)
            where = '' if sync_bn_scope is None else f' in {list(sync_bn_scope)}'
            print_log(f'SyncBN ({sync_bn}){where}: norm layers now '
                      f'{norm_layer_counts(module)}', logger='current')
        elif sync_bn_scope is not None:
            raise ValueError(f'sync_bn_scope={list(sync_bn_scope)!r} needs sync_bn (e.g. '
                             "'allreduce'); without it no layer is synchronised.")
        super().__init__(module=module, find_unused_parameters=find_unused_parameters,
                         **kwargs)
        # names found by the 'auto' probe (None: not probed)
        self.probed_unused_parameters = probed
        self.comm_compression = comm_compression
        if hook is not None:
            self.register_comm_hook(state=None, hook=hook)
            print_log(f'DDP gradients are all-reduced in {comm_compression}.',
                      logger='current')

    @staticmethod
    def _probe(module: nn.Module, probe_dataloader: Optional[dict]) -> List[str]:
        names = probe_unused_parameters(module, probe_dataloader)
        if names:
            shown = ', '.join(names[:20]) + (' ...' if len(names) > 20 else '')
            print_log(f"find_unused_parameters='auto': {len(names)} parameter(s) get no "
                      f'gradient on the probe batch, so DDP will look for unused '
                      f'parameters every iteration: {shown}. If they should train, '
                      'check the loss; if they never train, freeze them '
                      '(requires_grad=False) and the search is not needed.',
                      logger='current')
        elif get_rank() == 0:
            print_log("find_unused_parameters='auto': every trainable parameter gets a "
                      'gradient on the probe batch; DDP runs without the unused-'
                      'parameter search.', logger='current')
        return names
