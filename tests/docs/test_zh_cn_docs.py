"""The Chinese pages stay in step with their English twins.

Every fenced block of an English page (the commands and configs under ```bash /
```python / ```shell ..., and the printed tables and messages under a bare fence) must
appear byte for byte in its Chinese twin, so a changed command or figure in English
fails here until the translation follows. The pages link to each other at the top, and
every relative link of a Chinese page resolves to a file.
"""
import re
from pathlib import Path
from typing import List, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
# English page -> Chinese twin (paths from the repository root).
TWINS = {
    'README.md': 'README_zh-CN.md',
    'docs/bevfusion.md': 'docs/zh_cn/bevfusion.md',
    'docs/scaling_guide.md': 'docs/zh_cn/scaling_guide.md',
    'docs/hooks.md': 'docs/zh_cn/hooks.md',
}
# An opening fence: up to 3 spaces, 3+ backticks or tildes, an optional info string.
FENCE = re.compile(r'^ {0,3}(`{3,}|~{3,})(.*)$')
LINK = re.compile(r'\]\(([^)\s]+)\)')


def fenced_blocks(text: str) -> List[Tuple[str, str]]:
    """``(info string, block text from opening to closing fence)`` of every fenced block."""
    blocks, lines, start, fence, info = [], text.splitlines(keepends=True), None, '', ''
    for index, line in enumerate(lines):
        match = FENCE.match(line.rstrip('\n'))
        if start is None and match:
            start, fence, info = index, match.group(1), match.group(2).strip()
        elif start is not None and line.strip().startswith(fence) \
                and not line.strip().strip(fence[0]):
            blocks.append((info, ''.join(lines[start:index + 1])))
            start = None
    assert start is None, f'unclosed fence opened at line {start + 1}'
    return blocks


def relative_links(text: str) -> List[str]:
    links = [m.group(1) for m in LINK.finditer(text)]
    return [link.split('#')[0] for link in links
            if not re.match(r'[a-z]+:', link) and not link.startswith('#')]


def _read(path: str) -> str:
    return (REPO / path).read_text(encoding='utf-8')


def test_fenced_blocks_are_found():
    text = 'a\n```bash\nrun x\n```\n\n```\nout\n```\n````python\nx = 1\n````\n'
    assert [info for info, _ in fenced_blocks(text)] == ['bash', '', 'python']
    assert fenced_blocks(text)[0][1] == '```bash\nrun x\n```\n'
    assert fenced_blocks(_read('README.md')), 'README.md has no fenced blocks any more?'


@pytest.mark.parametrize('english,chinese', sorted(TWINS.items()))
def test_every_block_is_in_the_twin(english, chinese):
    translated = _read(chinese)
    blocks = fenced_blocks(_read(english))
    missing = [(number, block) for number, (_, block) in enumerate(blocks, 1)
               if block not in translated]
    shown = '\n'.join(f'--- block {number} of {len(blocks)} in {english} ---\n{block}'
                      for number, block in missing)
    assert not missing, (f'{len(missing)} fenced block(s) of {english} are not in '
                         f'{chinese} byte for byte; update the translation:\n{shown}')


@pytest.mark.parametrize('english,chinese', sorted(TWINS.items()))
def test_twins_link_to_each_other(english, chinese):
    for page, twin in ((english, chinese), (chinese, english)):
        head = _read(page).splitlines()[0]
        targets = [(REPO / page).parent.joinpath(link).resolve()
                   for link in relative_links(head)]
        assert (REPO / twin).resolve() in targets, (
            f'the first line of {page} must link to {twin}; it is: {head!r}')


@pytest.mark.parametrize('chinese', sorted(TWINS.values()))
def test_relative_links_of_chinese_pages_resolve(chinese):
    base = (REPO / chinese).parent
    broken = [link for link in relative_links(_read(chinese))
              if link and not base.joinpath(link).exists()]
    assert not broken, f'{chinese}: links to missing files: {broken}'
