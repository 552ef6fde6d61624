"""Gradient checkpointing switched off and on again on a built model, so one built
model serves every variant of the fastest fit (:mod:`.fastest_fit`)."""
from typing import Dict, List, Tuple

from torch import nn


class CheckpointSwitch:
    """Turn the gradient checkpointing a built model was configured with off or on.

    Records, at construction, the modules whose boolean ``with_cp`` is True (mmdet's
    Swin blocks and ResNet blocks, this package's ``GeneralizedLSSFPN`` and
    ``DepthLSSTransform``, ...) and BEVFusion's ``checkpoint_modules``. ``set(False)``
    clears them, ``set(True)`` restores them: all of these modules read the flag at
    every forward, so no rebuild is needed. mmengine's ``activation_checkpointing``
    config key wraps forwards at build time and is not switched here.

    Args:
        model: the unwrapped model, as configured.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.flagged: List[Tuple[str, nn.Module]] = [
            (name, m) for name, m in model.named_modules()
            if isinstance(getattr(m, 'with_cp', None), bool) and m.with_cp]
        self.listed: List[Tuple[str, nn.Module, tuple]] = [
            (name, m, tuple(m.checkpoint_modules)) for name, m in model.named_modules()
            if isinstance(getattr(m, 'checkpoint_modules', None), (tuple, list))
            and len(m.checkpoint_modules)]
        self._on = True

    @property
    def available(self) -> bool:
        """Whether the model was configured with any checkpointing to switch."""
        return bool(self.flagged or self.listed)

    @property
    def is_on(self) -> bool:
        return self._on and self.available

    def describe(self) -> str:
        """The checkpointed modules, for the log (top-level names, counted)."""
        counts: Dict[str, int] = {}
        for name, _ in self.flagged:
            top = name.split('.')[0] or type(self.model).__name__
            counts[top] = counts.get(top, 0) + 1
        parts = [f'{top} ({n} with_cp module{"s" if n > 1 else ""})'
                 for top, n in counts.items()]
        parts += [f'{name or "model"}.checkpoint_modules={list(mods)}'
                  for name, _, mods in self.listed]
        return ', '.join(parts) or 'none'

    def set(self, on: bool) -> None:
        """Checkpointing as configured (``True``) or none (``False``)."""
        for _, module in self.flagged:
            module.with_cp = bool(on)
        for _, module, mods in self.listed:
            module.checkpoint_modules = mods if on else ()
        self._on = bool(on)
