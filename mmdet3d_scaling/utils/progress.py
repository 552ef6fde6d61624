"""Progress bars with an ETA for the plugin's long-running tools, under one policy.

``tools/benchmark_scaling.py``, ``tools/benchmark_auto_batch_size.py`` (and the batch
size search itself) and ``tools/analysis/count_host_reads.py`` show a ``tqdm`` bar while
they work. The policy, the same for all three:

- bars go to **stderr** only; the tools' results stay on stdout, byte for byte the
  same with or without bars (text printed while a bar is up goes through :func:`echo`,
  which takes the bar off the terminal line first and puts it back after);
- no bar when stderr is not a terminal (CI, ``2> log``, ``subprocess`` pipes), when
  the tool ran with ``--no-progress`` (:func:`add_argument` / :func:`configure`), when
  the environment sets ``MMDET3D_SCALING_NO_PROGRESS=1`` (e.g. the batch size search of
  a ``tools/train.py`` run, which has no such flag), or in a process of rank > 0 (the
  ``RANK`` variable torchrun and mmengine's launchers set): one bar per job.

A disabled bar is a real ``tqdm`` object with ``disable=True``: callers update it
unconditionally and it writes nothing.
"""
import argparse
import os
import sys
from typing import Any, Optional, TextIO

from tqdm import tqdm

ENV_VAR = 'MMDET3D_SCALING_NO_PROGRESS'
FLAG_HELP = ('no progress bars (they go to stderr, and only when stderr is a terminal; '
             f'{ENV_VAR}=1 turns them off too)')

_disabled = False  # set by a tool's --no-progress (configure)


def disable() -> None:
    """Turn bars off for the rest of this process (what ``--no-progress`` does)."""
    global _disabled
    _disabled = True


def _env_disabled() -> bool:
    value = os.environ.get(ENV_VAR, '').strip()
    if value in ('', '0'):
        return False
    if value == '1':
        return True
    raise ValueError(f'{ENV_VAR}={value!r} is not understood: set it to 1 (no progress '
                     'bars) or 0 / leave it unset (bars when stderr is a terminal).')


def _is_main_process() -> bool:
    return os.environ.get('RANK', '0').strip() in ('', '0')


def enabled(stream: Optional[TextIO] = None) -> bool:
    """Whether a bar on ``stream`` (default ``sys.stderr``) would be shown."""
    stream = sys.stderr if stream is None else stream
    if _disabled or _env_disabled() or not _is_main_process():
        return False
    isatty = getattr(stream, 'isatty', None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed stream
        return False


def bar(total: Optional[float] = None, desc: str = '', unit: str = 'it',
        stream: Optional[TextIO] = None, show: bool = True, **kwargs: Any) -> tqdm:
    """A ``tqdm`` bar under the policy above (``tqdm``'s own arguments pass through).

    Args:
        total: expected count (None: unknown, a counter without ETA until it is set).
        desc: what is counted, shown left of the bar.
        unit: the unit of the count.
        stream: where the bar goes. Defaults to ``sys.stderr``.
        show: False hides it whatever the policy says (e.g. a rank that is not the
            main one in a process group created without ``RANK``).
    """
    stream = sys.stderr if stream is None else stream
    return tqdm(total=total, desc=desc, unit=unit, file=stream,
                disable=not (show and enabled(stream)), dynamic_ncols=True, **kwargs)


def echo(*values: Any, file: Optional[TextIO] = None) -> None:
    """``print(*values, flush=True)`` that first takes any bar off the terminal line (so
    the text is not glued to a bar) and redraws it after; the printed text is unchanged."""
    file = sys.stdout if file is None else file
    with writing(file):
        print(*values, file=file, flush=True)


def writing(file: Optional[TextIO] = None) -> Any:
    """``with writing():`` around code that prints or logs to ``file`` (default
    stdout) while a bar is up: the bar leaves the line first and comes back after."""
    return tqdm.external_write_mode(file=sys.stdout if file is None else file)


def add_argument(parser: argparse.ArgumentParser) -> None:
    """Add the tools' shared ``--no-progress`` flag."""
    parser.add_argument('--no-progress', action='store_true', help=FLAG_HELP)


def configure(args: argparse.Namespace) -> None:
    """Apply ``--no-progress`` of parsed arguments (see :func:`add_argument`)."""
    if getattr(args, 'no_progress', False):
        disable()
