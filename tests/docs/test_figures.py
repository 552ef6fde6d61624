"""Figures quoted in the docs are the figures in the data files they cite.

The rule (what a figure is, where it must be found, in which units) is in
``tests/docs/figure_rules.py``. Every README and docs page (any language) that links a
data file is checked, the measurement log included.
"""
import pytest

from tests.docs import figure_rules as rules
from tests.docs.figure_rules import REPO

# The pages whose figures must be backed; any other docs page that links a data file is
# found by pages_citing_data() and checked too.
REQUIRED = ['README.md', 'README_zh-CN.md', 'docs/benchmarks.md', 'docs/parity.md',
            'docs/demo.md']
def checked_pages():
    pages = {str(p.relative_to(REPO)) for p in rules.pages_citing_data()} | set(REQUIRED)
    return sorted(pages)


@pytest.mark.parametrize('page', checked_pages())
def test_quoted_figures_are_in_the_cited_data_files(page):
    problems = rules.check_page(REPO / page)
    assert not problems, '\n'.join(problems)


@pytest.mark.parametrize('page', REQUIRED)
def test_required_pages_cite_data(page):
    assert rules.cited_blocks(REPO / page), f'{page} cites no data file any more'


@pytest.mark.parametrize('page', ['docs/benchmarks.md', 'docs/parity.md', 'README.md'])
def test_a_changed_figure_fails(page):
    original = (REPO / page).read_text(encoding='utf-8')
    block, figure = rules.first_figure(REPO / page)
    # the nearest larger value at the quoted precision that the cited files do not hold
    pool = rules.candidates(set().union(*(rules.file_numbers(REPO / f) for f in block.data_files)))
    step = 10 ** -figure.decimals
    larger = (f'{abs(figure.value) + k * step:.{figure.decimals}f}' for k in range(1, 1000))
    changed_value = next(text for text in larger
                         if not any(abs(x - float(text)) <= step / 2 for x in pool))
    changed_block = block.text.replace(figure.text.lstrip('+-'), changed_value, 1)
    assert changed_block != block.text
    problems = rules.check_page(REPO / page, original.replace(block.text, changed_block, 1))
    assert any(changed_value in p for p in problems), problems


def test_a_missing_data_file_fails():
    text = 'Throughput 16.48 samples/s ([run](data/no_such_run.json)).\n'
    problems = rules.check_page(REPO / 'docs' / 'benchmarks.md', text)
    assert problems and 'does not exist' in problems[0]


def test_the_rule():
    text = ('On 2 GPUs, batch 8, torch 2.11, IoU 0.7, voxels 0.075 m: 16.48 vs 9.21 '
            'samples/s (1.79x), 0.8 %, 20.2 GiB, `lr=0.1234`, +10.0 % and 5,212.5 ops.')
    quoted = [(f.text, f.is_ratio, f.signed_percent) for f in rules.figures(text)]
    assert quoted == [('16.48', False, False), ('9.21', False, False), ('1.79', True, False),
                      ('0.8', False, False), ('20.2', False, False), ('+10.0', False, True),
                      ('5212.5', False, False)]
    pool = rules.candidates({16.480102, 9.2094588, 0.00754, 20690.6, 5212.5})
    figures = rules.figures(text)
    found = {f.text: rules.found(f, pool, figures) for f in figures}
    # 1.79x: ratio of two quoted figures; +10.0 %: no pair of quoted figures gives it
    assert found == {'16.48': True, '9.21': True, '1.79': True, '0.8': True, '20.2': True,
                     '+10.0': False, '5212.5': True}


def test_tables_check_each_row_with_its_caption():
    text = ('Data: [a](data/a.json).\n\n| run | samples/s |\n|---|---|\n| x | 1.25 |\n'
            '| y | 2.50 ([b](data/b.json)) |\n')
    blocks = [(b.text.strip(), b.data_files)
              for b in rules.cited_blocks(REPO / 'docs' / 'x.md', text)]
    assert blocks == [('Data: [a](data/a.json).', ['docs/data/a.json']),
                      ('| x | 1.25 |', ['docs/data/a.json']),
                      ('| y | 2.50 ([b](data/b.json)) |', ['docs/data/b.json', 'docs/data/a.json'])]
