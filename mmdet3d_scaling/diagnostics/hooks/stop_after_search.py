"""StopAfterSearch: run a measurement right after the start-up searches, then end
``train()`` there (``tools/analysis/fit_table.py``)."""
from typing import Any, Callable

from mmengine.hooks import Hook


class SearchDone(Exception):
    """Raised by :class:`StopAfterSearch` to end ``runner.train()`` on purpose; the
    tool that registered the hook catches it."""


class StopAfterSearch(Hook):
    """Call ``measure(runner)`` in ``before_run``, after the searches, then stop.

    Registered with ``runner.register_hook`` after the runner is built: at priority
    ``'HIGHEST'`` it comes after the hooks of that priority already there, such as
    ``FastestFitHook``, so their results are ready. It then raises :class:`SearchDone`,
    before weights are initialised (no download of pretrained weights) or a step is
    trained. Not registered in ``HOOKS``: configs never name it.

    Args:
        measure: called once with the runner; what it returns is kept in ``result``.
    """

    priority = 'HIGHEST'

    def __init__(self, measure: Callable[[Any], Any]):
        self.measure = measure
        self.result: Any = None

    def before_run(self, runner) -> None:
        self.result = self.measure(runner)
        raise SearchDone('measured after the start-up search; no training')
