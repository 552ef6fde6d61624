"""The arithmetic of the scaling recipe: total batch -> per-GPU batch x GPUs x
accumulation, the LR factor, and the plan's table. No config here: the recipe step
(:mod:`.scaling_recipe`) reads ``scaling``, :mod:`.plan_writer` writes a plan into a
config.
"""
import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

from .validators import positive_int as _positive_int

LR_SCALINGS = ('linear', 'sqrt', 'none')


@dataclass
class ScalingPlan:
    """How one optimizer step's batch is split over GPUs and micro-batches.

    Args:
        world_size: number of processes (GPUs).
        per_gpu_batch: samples per GPU per forward/backward (micro-batch).
        accumulation: micro-batches per optimizer step.
        total_batch: samples per optimizer step, all GPUs together
            (= world_size x per_gpu_batch x accumulation).
        base_batch: total batch the configured LR was tuned for.
        lr_scaling: rule from total/base to the LR factor: 'linear', 'sqrt', 'none'.
        lr_scale: factor applied to the configured LR values.
    """
    world_size: int
    per_gpu_batch: int
    accumulation: int
    total_batch: int
    base_batch: int
    lr_scaling: str
    lr_scale: float

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> 'ScalingPlan':
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    @property
    def samples_per_iter(self) -> int:
        """Samples all GPUs together consume in one loop iteration (micro-step)."""
        return self.world_size * self.per_gpu_batch



def nearest_multiples(value: int, step: int) -> List[int]:
    """The multiples of ``step`` just below and just above ``value`` (positive ones)."""
    below = (value // step) * step
    above = below if below == value else below + step
    return sorted({v for v in (below, above) if v > 0})


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def lr_factor(total_batch: int, base_batch: int, lr_scaling: str) -> float:
    """LR multiplier for ``total_batch`` when the LR was tuned for ``base_batch``."""
    if lr_scaling not in LR_SCALINGS:
        raise ValueError(f'scaling.lr_scaling={lr_scaling!r} is not one of '
                         f'{", ".join(LR_SCALINGS)}')
    ratio = total_batch / base_batch
    return {'linear': ratio, 'sqrt': math.sqrt(ratio), 'none': 1.0}[lr_scaling]


def make_plan(total_batch_size: int,
              world_size: int,
              per_gpu_batch: Optional[int] = None,
              max_per_gpu_batch: Optional[int] = None,
              base_batch_size: Optional[int] = None,
              lr_scaling: str = 'linear') -> ScalingPlan:
    """Split ``total_batch_size`` over ``world_size`` GPUs and accumulation steps.

    Args:
        total_batch_size: samples per optimizer step, all GPUs together.
        world_size: number of processes.
        per_gpu_batch: fixed micro-batch per GPU; None picks the largest divisor of
            ``total_batch_size / world_size`` that is <= ``max_per_gpu_batch``.
        max_per_gpu_batch: most samples a GPU can take at once (memory); None: no cap.
        base_batch_size: total batch the LR was tuned for; None: ``total_batch_size``
            (LR unchanged).
        lr_scaling: 'linear', 'sqrt' or 'none'.

    Raises:
        ValueError: the numbers do not split evenly or break the cap; the message
            names the numbers and the nearest valid totals.
    """
    total = _positive_int('total_batch_size', total_batch_size)
    world = _positive_int('world_size', world_size)
    base = total if base_batch_size is None else _positive_int('base_batch_size',
                                                                base_batch_size)
    cap = None if max_per_gpu_batch is None else _positive_int('max_per_gpu_batch_size',
                                                                max_per_gpu_batch)
    scale = lr_factor(total, base, lr_scaling)
    if total % world:
        raise ValueError(
            f'total_batch_size={total} cannot be split evenly over {world} GPUs: it '
            f'must be a multiple of the world size. Nearest valid totals: '
            f'{_join(nearest_multiples(total, world))}.')
    per_rank = total // world
    if per_gpu_batch is not None:
        per_gpu = _positive_int('per_gpu_batch_size', per_gpu_batch)
        if cap is not None and per_gpu > cap:
            raise ValueError(
                f'per_gpu_batch_size={per_gpu} is above the per-GPU cap '
                f'max_per_gpu_batch_size={cap}: lower per_gpu_batch_size to <= {cap} '
                'or raise the cap if the GPU memory allows.')
        if per_rank % per_gpu:
            raise ValueError(
                f'total_batch_size={total} over {world} GPUs is {per_rank} samples per '
                f'GPU per optimizer step, which per_gpu_batch_size={per_gpu} does not '
                f'divide. Nearest valid totals with this per-GPU batch: '
                f'{_join(nearest_multiples(total, world * per_gpu))}; or use a per-GPU '
                f'batch that divides {per_rank}: {_join(_divisors(per_rank))}.')
    else:
        allowed = [d for d in _divisors(per_rank) if cap is None or d <= cap]
        per_gpu = max(allowed)  # 1 always divides, so never empty
    return ScalingPlan(world_size=world, per_gpu_batch=per_gpu,
                       accumulation=per_rank // per_gpu, total_batch=total,
                       base_batch=base, lr_scaling=lr_scaling, lr_scale=scale)


def _join(values: Sequence[int]) -> str:
    return ', '.join(str(v) for v in values)


def plan_hint(plan: ScalingPlan, max_per_gpu_batch: Optional[int]) -> Optional[str]:
    """A suggestion when the per-GPU batch had to stay well below the cap."""
    if max_per_gpu_batch is None or plan.per_gpu_batch * 2 > max_per_gpu_batch:
        return None
    step = plan.world_size * max_per_gpu_batch
    return (f'per-GPU batch {plan.per_gpu_batch} is well below the cap '
            f'{max_per_gpu_batch} because {plan.total_batch // plan.world_size} samples '
            f'per GPU have no larger divisor <= {max_per_gpu_batch}; totals '
            f'{_join(nearest_multiples(plan.total_batch, step))} would use the full '
            'per-GPU batch with fewer accumulation steps.')


def format_plan(plan: ScalingPlan) -> str:
    """The plan as a small table, printed at the start of training."""
    rows = [
        ('GPUs (world size)', str(plan.world_size)),
        ('batch per GPU', str(plan.per_gpu_batch)),
        ('accumulation steps', str(plan.accumulation)),
        ('total batch / optimizer step',
         f'{plan.total_batch} = {plan.world_size} x {plan.per_gpu_batch} x '
         f'{plan.accumulation}'),
        ('LR tuned for total batch', str(plan.base_batch)),
        ('LR scaling', f'{plan.lr_scaling}: x {plan.lr_scale:.6g}'),
    ]
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    line = '+' + '-' * (width + 2) + '+' + '-' * (vwidth + 2) + '+'
    body = [f'| {k.ljust(width)} | {v.ljust(vwidth)} |' for k, v in rows]
    return '\n'.join(['Scaling plan', line, *body, line])
