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

from . import (AutoBatchSizeHook, FastestFitHook, GarbageCollectionHook, GPUMonitorHook,
               GradientCumulativeOptimizerHook, HangDoctorHook, NonFiniteGuardHook,
               PreemptionHook, ScalingPlanHook)

#: every hook of the package that takes options (a new one must be added, and documented)
DOCUMENTED = (GPUMonitorHook, GradientCumulativeOptimizerHook, AutoBatchSizeHook,
              FastestFitHook, ScalingPlanHook, GarbageCollectionHook, NonFiniteGuardHook,
              PreemptionHook, HangDoctorHook)
START = '<!-- hook-options:{name} -->'
END = '<!-- /hook-options -->'
HEADERS = {'en': ('option', 'default', 'unit / meaning'),
           'zh_cn': ('选项', '默认值', '单位 / 含义')}


def rows(hook: type) -> List[Tuple[str, str]]:
    """(option, default) cells of ``hook``'s constructor, in signature order."""
    found = []
    for name, param in inspect.signature(hook.__init__).parameters.items():
        if name == 'self' or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = 'required' if param.default is param.empty else f'`{param.default!r}`'
        found.append((f'`{name}`', default))
    return found


def arg_docs(hook: type) -> Dict[str, str]:
    """Option -> the first sentence of its entry in the class docstring's ``Args:``."""
    doc = inspect.getdoc(hook) or ''
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
