"""The hooks' options and defaults, read from their signatures: the reference tables of
``docs/hooks.md`` and ``docs/zh_cn/hooks.md``.

Each documented hook has one table between ``<!-- hook-options:<Hook> -->`` and
``<!-- /hook-options -->``: one row an option, in signature order, whose first two cells
(option, default) are exactly :func:`rows` (``tests/hooks/test_reference.py`` fails on
any difference, in both languages); the third cell (unit / meaning) is the page's own
words. ``python -m mmdet3d_scaling.hooks.reference [Hook ...]`` prints the tables, the
meanings taken from the hooks' ``Args:`` sections, to paste into a page.
"""
import argparse
import inspect
import re
from typing import Dict, List, Optional, Tuple

from ..batch_size import AutoBatchSizeHook, FastestFitHook
from . import (GarbageCollectionHook, GPUMonitorHook, GradientCumulativeOptimizerHook,
               HangDoctorHook, NonFiniteGuardHook, PreemptionHook, ScalingPlanHook)

#: every hook of the package that takes options (a new one must be added, and documented)
DOCUMENTED = (GPUMonitorHook, GradientCumulativeOptimizerHook, AutoBatchSizeHook,
              FastestFitHook, ScalingPlanHook, GarbageCollectionHook, NonFiniteGuardHook,
              PreemptionHook, HangDoctorHook)
START = '<!-- hook-options:{name} -->'
END = '<!-- /hook-options -->'
HEADERS = {'en': ('option', 'default', 'unit / meaning'),
           'zh_cn': ('选项', '默认值', '单位 / 含义')}


def _options(hook: type) -> List[inspect.Parameter]:
    """The constructor's named options, then those of the base class it passes its
    ``**kwargs`` to (the search hooks' shared options), each once."""
    found: Dict[str, inspect.Parameter] = {}
    for cls in hook.__mro__:
        init = cls.__dict__.get('__init__')
        if init is None:
            continue
        forwards = False
        for name, param in inspect.signature(init).parameters.items():
            if param.kind is param.VAR_KEYWORD:
                forwards = True
            elif name != 'self' and param.kind is not param.VAR_POSITIONAL:
                found.setdefault(name, param)
        if not forwards:
            break
    return list(found.values())


def rows(hook: type) -> List[Tuple[str, str]]:
    """(option, default) cells of ``hook``'s constructor, in signature order."""
    return [(f'`{p.name}`', 'required' if p.default is p.empty else f'`{p.default!r}`')
            for p in _options(hook)]


def _docstring_args(cls: type) -> Dict[str, str]:
    """Option -> its entry in ``cls``'s own docstring's ``Args:`` section."""
    doc = inspect.cleandoc(cls.__dict__.get('__doc__') or '')
    section = doc.split('Args:', 1)[1] if 'Args:' in doc else ''
    entries: Dict[str, str] = {}
    name: Optional[str] = None
    for line in section.splitlines():
        match = re.match(r'^    (\w+)(?: \(.*?\))?: (.*)', line)
        if match:
            name, text = match.groups()
            entries[name] = text
        elif name is not None and line.startswith('        '):
            entries[name] += ' ' + line.strip()
        elif line.strip():
            break  # the section ended
    return entries


def arg_docs(hook: type) -> Dict[str, str]:
    """Option -> the first sentence of its entry in the ``Args:`` of the class
    docstring (or of the base class that takes it)."""
    entries: Dict[str, str] = {}
    for cls in reversed(hook.__mro__):
        entries.update(_docstring_args(cls))
    first = {k: re.split(r'(?<=\.)\s+(?=[A-Z])', v, 1)[0] for k, v in entries.items()}
    return {k: v.replace('``', '`').rstrip('.') for k, v in first.items()}


def markdown_table(hook: type, lang: str = 'en') -> str:
    """``hook``'s table with its markers; meanings from its docstring."""
    meanings = arg_docs(hook)
    head = HEADERS[lang]
    lines = [START.format(name=hook.__name__), f'| {" | ".join(head)} |', '|---|---|---|']
    for option, default in rows(hook):
        lines.append(f'| {option} | {default} | {meanings.get(option.strip("`"), "")} |')
    lines.append(END)
    return '\n'.join(lines)


def documented_rows(text: str, hook: type) -> List[Tuple[str, str]]:
    """The (option, default) cells of ``hook``'s marked table in a page's ``text``.

    Raises:
        ValueError: the page holds the markers not exactly once, naming the fix.
    """
    start = START.format(name=hook.__name__)
    if text.count(start) != 1:
        raise ValueError(
            f'{text.count(start)} tables marked {start} (one needed): put the output of '
            f'`python -m mmdet3d_scaling.hooks.reference {hook.__name__}` in the page')
    block = text.split(start, 1)[1].split(END, 1)[0]
    body = [line for line in block.strip().splitlines()[2:] if line.startswith('|')]
    return [tuple(c.strip() for c in line.strip('|').split('|')[:2]) for line in body]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description='Print hook option tables (markdown).')
    parser.add_argument('hooks', nargs='*', help='hook names (default: every documented)')
    parser.add_argument('--lang', choices=sorted(HEADERS), default='en')
    args = parser.parse_args(argv)
    known = {h.__name__: h for h in DOCUMENTED}
    unknown = [n for n in args.hooks if n not in known]
    if unknown:
        parser.error(f'unknown hook(s) {unknown}; documented: {", ".join(known)}')
    for name in args.hooks or known:
        print(markdown_table(known[name], args.lang) + '\n')


if __name__ == '__main__':
    main()
