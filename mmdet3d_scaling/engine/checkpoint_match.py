"""Does a checkpoint fit the model? Key and shape comparison for ``ScalingRunner``.

mmengine loads checkpoints with ``strict=False``: a checkpoint of another model, or one
with missing, unexpected or shape-mismatched keys, only prints a warning, so
``--resume`` continues with randomly initialised layers (and another model's optimizer
state) and ``tools/test.py`` scores a random model, both with exit code 0. The runner
compares the checkpoint's weights with the model before loading them:

- ``resume`` (``--resume``) and ``evaluate`` (``tools/test.py``, ``runner.val()`` /
  ``runner.test()`` with ``load_from``) refuse a mismatch unless the config sets
  ``resume_strict = False`` (``--cfg-options resume_strict=False``);
- ``finetune`` (``load_from`` for training, the schedule starts again) keeps mmengine's
  lenient loading and logs a one-line summary.
"""
import re
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Sequence, Tuple

import torch

from ..utils.model import unwrap_model

STRICT_KEY = 'resume_strict'
SHOWN = 5  # names listed per kind of mismatch
PURPOSES = ('resume', 'evaluate', 'finetune')


@dataclass
class KeyReport:
    """How a checkpoint's weights differ from a model's state dict.

    Args:
        n_model: number of keys in the model's state dict.
        n_checkpoint: number of weights in the checkpoint.
        missing: model keys the checkpoint lacks (BatchNorm counters excluded).
        unexpected: checkpoint keys the model lacks.
        mismatched: (key, checkpoint shape, model shape) of keys in both.
    """
    n_model: int
    n_checkpoint: int
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    mismatched: List[Tuple[str, tuple, tuple]] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def counts(self) -> str:
        return (f'{len(self.missing)} missing, {len(self.unexpected)} unexpected, '
                f'{len(self.mismatched)} shape-mismatched key(s) (model '
                f'{self.n_model} keys, checkpoint {self.n_checkpoint})')

    def details(self) -> str:
        parts = []
        for label, names in (('missing', self.missing), ('unexpected', self.unexpected)):
            if names:
                parts.append(f'{label}: {_first(names)}')
        if self.mismatched:
            shown = [f'{k} (checkpoint {list(c)} vs model {list(m)})'
                     for k, c, m in self.mismatched]
            parts.append(f'shape-mismatched: {_first(shown)}')
        return '; '.join(parts)


def _first(names: Sequence[str]) -> str:
    more = len(names) - SHOWN
    return ', '.join(names[:SHOWN]) + (f' and {more} more' if more > 0 else '')


def bare_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose state dict checkpoints hold (no DDP / TTA wrapper)."""
    return unwrap_model(model, tta=True)


def checkpoint_weights(checkpoint: Mapping, revise_keys: Sequence[Tuple[str, str]]
                       ) -> Mapping[str, Any]:
    """The checkpoint's state dict with keys revised as mmengine loads them."""
    weights = checkpoint.get('state_dict', checkpoint)
    for pattern, replacement in revise_keys:
        weights = {re.sub(pattern, replacement, k): v for k, v in weights.items()}
    return weights


def compare(model: torch.nn.Module, weights: Mapping[str, Any]) -> KeyReport:
    """Compare ``weights`` (revised keys) with ``model``'s state dict."""
    own = bare_model(model).state_dict()
    report = KeyReport(n_model=len(own), n_checkpoint=len(weights))
    # mmengine ignores missing BatchNorm counters too (old checkpoints lack them)
    report.missing = [k for k in own if k not in weights
                      and not k.endswith('num_batches_tracked')]
    report.unexpected = [k for k in weights if k not in own]
    for key, value in weights.items():
        if key in own and isinstance(value, torch.Tensor) and \
                tuple(value.shape) != tuple(own[key].shape):
            report.mismatched.append((key, tuple(value.shape), tuple(own[key].shape)))
    return report


def strict_setting(cfg: Any) -> bool:
    """``resume_strict`` of the config (default True); anything but a bool is an error."""
    value = cfg.get(STRICT_KEY, True) if cfg is not None else True
    if not isinstance(value, bool):
        raise ValueError(f'{STRICT_KEY} must be True or False, got {value!r} '
                         f'(e.g. --cfg-options {STRICT_KEY}=False).')
    return value


def refusal(report: KeyReport, filename: str, purpose: str, model_name: str) -> str:
    """The error for a mismatching checkpoint: what differs, why it matters, the switch."""
    what = {'resume': 'resuming would continue training with these layers randomly '
                      'initialised and the optimizer state of another model',
            'evaluate': 'evaluating would score a model whose layers are partly '
                        'random, which is never a meaningful result'}[purpose]
    return (f'checkpoint {filename!r} does not match the model {model_name}: '
            f'{report.counts()}. {report.details()}. So {what}. Check that the config '
            f'and the checkpoint belong together. If the difference is intended (e.g. a '
            f'changed head), load it anyway with --cfg-options {STRICT_KEY}=False'
            + ('; to start a new schedule from these weights, use load_from without '
               '--resume (fine-tuning).' if purpose == 'resume' else '.'))


def summary(report: KeyReport, filename: str) -> str:
    """One log line for ``load_from`` (fine-tuning), which loads leniently."""
    if report.matches:
        return f'load_from {filename!r}: all {report.n_model} model keys loaded.'
    return (f'load_from {filename!r} (fine-tuning, loaded leniently): {report.counts()}; '
            f'{report.details()}. Missing and shape-mismatched layers keep their '
            'initialisation; unexpected weights are ignored.')
