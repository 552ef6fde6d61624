"""ProgressFileHook: a scaling benchmark run's progress, in a file its launcher reads."""
import json
import math
import os
import time
from typing import Any

from mmengine.hooks import Hook


class ProgressFileHook(Hook):
    """Writes ``{"done": micro-batches trained, "total": the run's micro-batches}`` to a
    JSON file, for the orchestrator's progress bar
    (:mod:`mmdet3d_scaling.diagnostics.scaling_benchmark.tracking`).

    Written by the first process of each machine, at most every ``interval_s`` seconds
    and at the last iteration, through a temporary file and a rename, so a reader never
    sees half a file. Not registered: the benchmark's worker adds it. Priority
    ``LOWEST``.

    Args:
        path (str): the JSON file.
        interval_s (float): least seconds between two writes. Defaults to 0.5.
    """

    priority = 'LOWEST'

    def __init__(self, path: str, interval_s: float = 0.5) -> None:
        self.path = path
        self.interval_s = interval_s
        self._last = -math.inf
        self._writer = os.environ.get('LOCAL_RANK', '0') == '0'

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        """Write the progress file when ``interval_s`` passed or training ends."""
        total = runner.train_loop.max_iters
        done = runner.iter + 1  # not yet incremented
        now = time.monotonic()
        if not self._writer or (done < total and now - self._last < self.interval_s):
            return
        self._last = now
        tmp = f'{self.path}.tmp'
        with open(tmp, 'w') as f:
            json.dump(dict(done=done, total=total), f)
        os.replace(tmp, self.path)
