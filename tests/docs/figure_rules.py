"""The rule that ties a figure quoted in the docs to the data file it cites.

A *block* is a paragraph (lines between blank lines), a list item or a table row;
fenced code blocks and headings are no blocks. A table also cites what the paragraph right above it
(its caption) links. Every link to a file under ``docs/data/`` must resolve, and every
*figure* in a block that links a data file must be found in the cited files:

- a figure is a number written with a decimal point (``16.48``, ``0.98``, ``20.2``);
  integers are counts and settings (GPUs, batch sizes, steps, seeds, dates, trials) and
  are not checked. Not figures either: versions (``2.1.0``, ``torch 2.11``), numbers
  in inline code, scientific notation, and settings named by the word before them
  (:data:`SETTING_WORDS`, e.g. ``IoU 0.7``, ``LR 0.003``, ``momentum 0.1``) or by a
  length unit after them (``0.075 m``).
- it is found when some number x of the cited files, rounded to the figure's decimals,
  equals it, for x as stored or in a unit the docs use: x * 100 (a fraction as a
  percentage), x / 1024 (MiB as GiB), x * 1000 (seconds as ms).
- a ratio figure (``1.79x``) is found like any figure, or as the ratio of two other
  figures quoted in the same paragraph or table (so both sides of a ratio are quoted and
  checked; the ratio is taken of the file's unrounded numbers behind them); a signed
  percentage (``+29.6 %``) likewise, or as the relative difference (a / b - 1) x 100.
- ``±`` spreads, ``[min, max]`` ranges and signed differences are figures like any other
  (the parity data files store mean, std, min, max and the difference to the reference).

JSON files give every numeric leaf, every number inside a string leaf and, for a raw
run record holding ``samples`` and ``seconds``, its samples / seconds; text files (.log,
.txt) every number in them.
"""
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Optional, Set

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = REPO / 'docs' / 'data'

# A markdown link target that points into docs/data (relative to the page).
DATA_LINK = re.compile(r'\]\(((?:\.\./)*(?:docs/)?data/[^)\s#]+)\)')
NUMBER = re.compile(
    r'(?<![\w.,])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)+(?:[eE][-+]?\d+)?(x?)(?![\w.]*\d)')
INLINE_CODE = re.compile(r'`[^`]*`')
LINK_TARGET = re.compile(r'\]\([^)]*\)')
# A decimal number right after one of these words (case-insensitive) is a setting or a
# version, not a measured figure.
SETTING_WORDS = (
    'iou', 'lr', 'momentum', 'eps', 'margin', 'torch', 'mmcv', 'mmdet3d', 'mmengine',
    'mmdetection3d', 'numpy', 'cuda', 'python', 'version', 'openmmlab', 'spconv',
    'scale', 'ratio of', 'interval', 'strict', 'loose')
SETTING_BEFORE = re.compile(r'(?:%s)\s*(?:=|:|>=|<=|>|<)?\s*$' % '|'.join(
    re.escape(w) for w in SETTING_WORDS), re.IGNORECASE)
LENGTH_UNIT_AFTER = re.compile(r'^\s*(?:m|mm|cm|m/s)\b')
LIST_ITEM = re.compile(r'^\s*(?:[-*+]|\d+\.)\s')
TABLE_RULE = re.compile(r'^\s*\|[\s:|-]+\|\s*$')
STRING_NUMBER = re.compile(r'[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?')


@dataclass
class Figure:
    text: str           # as quoted, without the trailing 'x'
    value: float
    decimals: int
    is_ratio: bool
    signed_percent: bool = False   # '+29.6 %': a relative difference


@dataclass
class Block:
    page: str
    line: int           # 1-based first line of the block
    text: str
    data_files: List[str] = field(default_factory=list)   # paths from the repository root
    context: str = ''   # where the two sides of a ratio may stand: the paragraph or table


def split_blocks(text: str) -> List[tuple]:
    """``(first line, text, is_table)`` of every paragraph / table outside code fences."""
    blocks, current, start, in_fence, fence = [], [], 0, False, ''
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if in_fence:
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                in_fence = False
            continue
        fence_match = re.match(r'^ {0,3}(`{3,}|~{3,})', line)
        is_table = stripped.startswith('|')
        ends = (not stripped or fence_match or stripped.startswith('#')
                or LIST_ITEM.match(line)
                or (current and is_table != current[0].strip().startswith('|')))
        if ends and current:
            blocks.append((start, '\n'.join(current), current[0].strip().startswith('|')))
            current = []
        if fence_match:
            in_fence, fence = True, fence_match.group(1)
            continue
        if stripped and not stripped.startswith('#'):
            if not current:
                start = number
            current.append(line)
    if current:
        blocks.append((start, '\n'.join(current), current[0].strip().startswith('|')))
    return blocks


def data_links(page: Path, text: str) -> List[str]:
    """Repository-relative paths of the data files ``text`` links (relative to ``page``)."""
    out = []
    for target in DATA_LINK.findall(text):
        path = (page.parent / target).resolve()
        try:
            out.append(str(path.relative_to(REPO)))
        except ValueError:
            out.append(str(path))
    return out


def cited_blocks(page: Path, content: Optional[str] = None) -> List[Block]:
    """Blocks of ``page`` (or of ``content`` read as if it stood at ``page``) that cite
    a data file; a table gives one block a row, each row citing what it links plus what
    the table's caption links."""
    rel = str(page.relative_to(REPO))
    result, caption = [], None
    if content is None:
        content = page.read_text(encoding='utf-8')
    for line, text, is_table in split_blocks(content):
        if not is_table:
            files = data_links(page, text)
            if files:
                result.append(Block(rel, line, text, files, text))
            caption = (line + text.count('\n'), files)
            continue
        inherited = caption[1] if caption and caption[0] == line - 2 else []
        rows = text.splitlines()
        for offset, row in enumerate(rows):
            is_header = offset + 1 < len(rows) and TABLE_RULE.match(rows[offset + 1])
            if TABLE_RULE.match(row) or is_header:
                continue   # the header and the rule under it
            files = data_links(page, row)
            files += [f for f in inherited if f not in files]
            if files:
                result.append(Block(rel, line + offset, row, files, text))
        caption = None
    return result


def figures(text: str) -> List[Figure]:
    """The figures of a block, by the rule in this module's docstring."""
    text = LINK_TARGET.sub(']()', INLINE_CODE.sub('``', text))
    found = []
    for match in NUMBER.finditer(text):
        raw = match.group(0)
        number = (raw[:-1] if match.group(1) else raw).replace(',', '')
        if 'e' in number.lower() or number.count('.') > 1:
            continue
        if SETTING_BEFORE.search(text[:match.start()]):
            continue
        if LENGTH_UNIT_AFTER.match(text[match.end():]):
            continue
        decimals = len(number.split('.')[1])
        signed_percent = number[0] in '+-' and re.match(r'\s*%', text[match.end():]) is not None
        found.append(Figure(number, float(number), decimals, bool(match.group(1)),
                            signed_percent))
    return found


def _numbers_in(value, out: Set[float]) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        out.add(float(value))
    elif isinstance(value, str):
        out.update(float(n) for n in STRING_NUMBER.findall(value))
    elif isinstance(value, dict):
        if isinstance(value.get('samples'), (int, float)) and value.get('seconds'):
            out.add(value['samples'] / value['seconds'])   # a raw run record's samples/s
        for item in value.values():
            _numbers_in(item, out)
    elif isinstance(value, list):
        for item in value:
            _numbers_in(item, out)


def file_numbers(path: Path) -> Set[float]:
    """Every number a data file holds (see the module docstring)."""
    text = path.read_text(encoding='utf-8', errors='replace')
    out: Set[float] = set()
    if path.suffix == '.json':
        _numbers_in(json.loads(text), out)
    else:
        out.update(float(n) for n in STRING_NUMBER.findall(text))
    return out


def candidates(numbers: Iterable[float]) -> Set[float]:
    """The numbers in the units the docs quote them in."""
    out = set()
    for x in numbers:
        out.update((x, x * 100, x / 1024, x * 1000))
    return out


def found(figure: Figure, pool: Set[float], block_figures: List[Figure]) -> bool:
    """Whether ``figure`` is one of ``pool``, or a ratio / relative difference of the
    pool's numbers behind two other figures quoted in ``block_figures``."""
    if _near(figure, pool):
        return True
    if not (figure.is_ratio or figure.signed_percent):
        return False
    sides = set()   # the unrounded numbers behind the block's other figures
    for other in block_figures:
        if not other.is_ratio and not other.signed_percent and other.value:
            step = 0.5 * 10 ** -other.decimals + 1e-9
            sides.update(x for x in pool if x and abs(x - other.value) <= step)
    derived = {a / b if figure.is_ratio else (a / b - 1) * 100 for a in sides for b in sides}
    return _near(figure, derived)


def _near(figure: Figure, numbers: Iterable[float]) -> bool:
    tolerance = 0.5 * 10 ** -figure.decimals + 1e-9
    return any(abs(x - figure.value) <= tolerance for x in numbers)


def check_page(page: Path, content: Optional[str] = None) -> List[str]:
    """Problems of one page: missing data files and figures not found in the cited files."""
    problems = []
    for block in cited_blocks(page, content):
        missing = [f for f in block.data_files if not (REPO / f).is_file()]
        problems += [f'{block.page}:{block.line}: cites {f}, which does not exist'
                     for f in missing]
        present = [f for f in block.data_files if f not in missing]
        if not present:
            continue
        pool = candidates(set().union(*(file_numbers(REPO / f) for f in present)))
        block_figures = figures(block.context)
        for figure in figures(block.text):
            if not found(figure, pool, block_figures):
                problems.append(
                    f'{block.page}:{block.line}: {figure.text}{"x" if figure.is_ratio else ""}'
                    f' is in none of {", ".join(present)} at {figure.decimals} decimals')
    return problems


def pages_citing_data() -> List[Path]:
    """README pages and docs pages (any language) that link a data file."""
    pages = sorted(REPO.glob('README*.md')) + sorted((REPO / 'docs').rglob('*.md'))
    return [p for p in pages if DATA_LINK.search(p.read_text(encoding='utf-8'))]


def first_figure(page: Path) -> Optional[tuple]:
    """``(block, figure)`` of the first checked figure of a page (for the mutation test)."""
    for block in cited_blocks(page):
        for figure in figures(block.text):
            if not figure.is_ratio:
                return block, figure
    return None
