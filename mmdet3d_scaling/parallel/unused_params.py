"""Find parameters that get no gradient, by one real training forward/backward.

DDP needs ``find_unused_parameters=True`` when some parameters take no part in the loss
(a head branch switched off, a frozen-but-trainable layer...): otherwise the backward
waits forever for their gradients. Setting it always costs a graph traversal every
iteration. The probe below decides once, before wrapping, and names the parameters.
"""
import copy
from typing import Any, Dict, List, Optional

import torch
from mmengine.dist import all_reduce, is_distributed
from torch import nn


def _loss(model: nn.Module, data: Any) -> torch.Tensor:
    """Loss of one batch the way ``BaseModel.train_step`` computes it."""
    data = model.data_preprocessor(data, True)
    if isinstance(data, dict):
        losses = model(**data, mode='loss')
    elif isinstance(data, (list, tuple)):
        losses = model(*data, mode='loss')
    else:
        raise TypeError(f'unsupported batch type {type(data).__name__} for the probe')
    loss, _ = model.parse_losses(losses)
    return loss


def unused_parameter_names(model: nn.Module, data: Any) -> List[str]:
    """Names of trainable parameters that receive no gradient from ``data``'s loss.

    The model's gradients, buffers (BatchNorm statistics), train/eval mode and the RNG
    state are restored afterwards, so the probe leaves no trace on training.
    In a distributed run every rank must call it; the result is the union over ranks
    (a parameter unused on any rank needs ``find_unused_parameters=True``).
    """
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    saved_grads = [p.grad for _, p in params]
    saved_buffers: Dict[str, torch.Tensor] = {
        n: b.detach().clone() for n, b in model.named_buffers()}
    was_training = model.training
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        for _, p in params:
            p.grad = None
        model.train()
        _loss(model, data).backward()
        unused = torch.tensor([float(p.grad is None) for _, p in params])
    finally:
        for (_, p), grad in zip(params, saved_grads):
            p.grad = grad
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in saved_buffers:
                    b.copy_(saved_buffers[n])
        model.train(was_training)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    if is_distributed():
        all_reduce(unused, op='max')
    return [n for (n, _), flag in zip(params, unused.tolist()) if flag > 0]


def first_batch(dataloader_cfg: dict) -> Any:
    """One batch of the configured training data, loaded in this process."""
    from mmengine.runner import Runner
    cfg = copy.deepcopy(dict(dataloader_cfg))
    cfg.update(num_workers=0, persistent_workers=False)
    cfg.pop('prefetch_factor', None)
    loader = Runner.build_dataloader(cfg)
    return next(iter(loader))


def probe_unused_parameters(model: nn.Module, dataloader_cfg: Optional[dict]) -> List[str]:
    """:func:`unused_parameter_names` on the first batch of ``dataloader_cfg``."""
    if not dataloader_cfg:
        raise ValueError(
            "find_unused_parameters='auto' needs a dataloader config to probe with "
            '(the distributed config step passes train_dataloader); set '
            'find_unused_parameters to True or False instead.')
    return unused_parameter_names(model, first_batch(dataloader_cfg))
