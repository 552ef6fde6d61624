"""The module inside a model wrapper (DDP, ``MMDistributedDataParallel``, ...)."""
import torch
from mmengine.model import BaseTTAModel, is_model_wrapper


def unwrap_model(model: torch.nn.Module, tta: bool = False) -> torch.nn.Module:
    """``model`` without its wrappers: what its parameters and state dict belong to.

    A wrapper is what mmengine's :func:`~mmengine.model.is_model_wrapper` recognises
    (torch's DDP, mmengine's wrappers and every class registered in its
    ``MODEL_WRAPPERS``); each holds the wrapped model as ``.module``.

    Args:
        model: a model, wrapped or not.
        tta: also unwrap mmengine's ``BaseTTAModel`` (test-time augmentation), as
            checkpoint loading does. Defaults to False.
    """
    while is_model_wrapper(model) or (tta and isinstance(model, BaseTTAModel)):
        model = model.module
    return model
