"""Plan: the arrangements of one effective batch ``T = B x K`` (processes x
micro-batch x accumulation) and the config's own effective batch."""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .errors import ParityError, positive


@dataclass
class Arrangement:
    """One way to train the effective batch.

    Args:
        name: label in the outputs, e.g. ``1proc_b2_acc4``.
        nproc: processes (GPUs).
        per_gpu_batch: samples per process per forward/backward (micro-batch).
        accumulation: micro-batches per optimizer step and process.
        stock: the config as written (no ``scaling`` overrides).
    """
    name: str
    nproc: int
    per_gpu_batch: int
    accumulation: int
    stock: bool = False

    @property
    def total_batch(self) -> int:
        return self.nproc * self.per_gpu_batch * self.accumulation

    def overrides(self) -> Dict[str, Any]:
        """``--cfg-options`` that select this arrangement through the recipe."""
        if self.stock:
            return {}
        return {'scaling.total_batch_size': self.total_batch,
                'scaling.per_gpu_batch_size': self.per_gpu_batch,
                'scaling.max_per_gpu_batch_size': self.per_gpu_batch}


def plan_arrangements(total_batch: int, batch: int, accumulation: int,
                      nprocs: Sequence[int] = (2,), stock: bool = False,
                      stock_batch: Optional[int] = None,
                      stock_accumulation: int = 1) -> List[Arrangement]:
    """The arrangements of ``total_batch = batch x accumulation``.

    Args:
        total_batch: samples per optimizer step (the config's ``scaling.total_batch_size``).
        batch: micro-batch B of the 1-process reference.
        accumulation: accumulation K of the reference (>= 2, else the reference and the
            no-accumulation arrangement are the same run).
        nprocs: process counts > 1 to add, each ``Nproc_bB_acc{K/N}``.
        stock: also the config as written.
        stock_batch: the config's own per-process batch (for the stock label).
        stock_accumulation: the config's own accumulation (for the stock loss curve).

    Raises:
        ParityError: the numbers do not fit together; the message names them and what
            would.
    """
    total = positive('total batch', total_batch)
    b = positive('--batch', batch)
    k = positive('--accumulation', accumulation)
    if b * k != total:
        raise ParityError(
            f'--batch {b} x --accumulation {k} = {b * k}, but the effective batch '
            f'(scaling.total_batch_size) is {total}: pick B and K with B x K = {total}, '
            f'e.g. {_factor_pairs(total)}.')
    if k < 2:
        raise ParityError(
            f'--accumulation {k}: the reference 1proc_b{b}_acc1 and the no-accumulation '
            f'arrangement 1proc_b{total} are the same run; use K >= 2 '
            f'(e.g. {_factor_pairs(total)}).')
    plan = [Arrangement(f'1proc_b{b}_acc{k}', 1, b, k),
            Arrangement(f'1proc_b{total}', 1, total, 1)]
    for n in sorted(set(nprocs)):
        n = positive('process count', n)
        if n == 1:
            raise ParityError('process count 1 is always run (the 1-process '
                              'arrangements); --nproc lists the counts > 1 to add.')
        if k % n:
            raise ParityError(
                f'--accumulation {k} cannot be split over {n} processes (micro-batch {b} '
                f'kept): K must be a multiple of every process count; with {n} processes '
                f'use K in {[m for m in range(n, 4 * n + 1, n)]} (and B = {total} / K), '
                f'or drop {n} from --nproc.')
        plan.append(Arrangement(f'{n}proc_b{b}_acc{k // n}', n, b, k // n))
    if stock:
        sb = stock_batch or 0
        plan.append(Arrangement('stock', 1, sb, stock_accumulation, stock=True))
    return plan


def select(arrangements: Sequence[Arrangement], names: Sequence[str]) -> List[Arrangement]:
    """The arrangements named in ``names``, in planned order.

    Raises:
        ParityError: a name is not among the planned arrangements.
    """
    known = [a.name for a in arrangements]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ParityError(f'--only {",".join(unknown)}: no such arrangement for these '
                          f'settings; planned: {", ".join(known)}')
    return [a for a in arrangements if a.name in names]


def _factor_pairs(total: int) -> str:
    pairs = [f'{d} x {total // d}' for d in range(1, total) if total % d == 0]
    return ', '.join(pairs) or f'{total} has no split with K >= 2'


def config_total_batch(cfg: Any) -> Tuple[int, str]:
    """The config's effective batch and where it comes from."""
    scaling = cfg.get('scaling') or {}
    if scaling.get('total_batch_size'):
        return int(scaling['total_batch_size']), 'scaling.total_batch_size'
    batch = int(cfg.train_dataloader.batch_size)
    acc = int((cfg.get('optim_wrapper') or {}).get('accumulative_counts') or 1)
    return batch * acc, (f'train_dataloader.batch_size={batch} x accumulation {acc} '
                         '(the config has no scaling key)')
