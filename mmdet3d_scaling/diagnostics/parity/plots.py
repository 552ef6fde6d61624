"""The loss-curve overlay PNG."""
import os
import os.path as osp
import statistics
from typing import Any, Dict, Sequence

from .plan import Arrangement


def plot_losses(records: Sequence[Dict[str, Any]], arrangements: Sequence[Arrangement],
                path: str, title: str = '') -> None:
    """Mean loss per optimizer step per arrangement, a band from the seeds' min to max."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5))
    for arr in arrangements:
        curves = [r['loss_curve'] for r in records
                  if r['arrangement'] == arr.name and r.get('loss_curve')]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        cols = [[c[i] for c in curves] for i in range(length)]
        steps = list(range(1, length + 1))
        mean = [statistics.fmean(c) for c in cols]
        line, = ax.plot(steps, mean, lw=1.2, label=f'{arr.name} ({len(curves)} seeds)')
        ax.fill_between(steps, [min(c) for c in cols], [max(c) for c in cols],
                        color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xlabel('optimizer step')
    ax.set_ylabel('training loss (mean over the step\'s micro-batches, rank 0)')
    ax.set_yscale('log')
    ax.set_title(title or 'loss per optimizer step: mean over seeds, band = seed min..max')
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
