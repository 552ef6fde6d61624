"""docs/auto_batch_size.md's fit table is the one its data files give."""
from pathlib import Path

from mmdet3d_scaling.diagnostics import fit_table

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / 'docs' / 'auto_batch_size.md'
START, END = '<!-- fit-table:start -->', '<!-- fit-table:end -->'
#: the table's data files, in the table's order
FILES = [f'docs/data/fit_table/fit_table_{m}.json'
         for m in ('bevfusion_lc', 'bevfusion_l', 'pv_rcnn', 'second', 'pointpillars')]


def test_fit_table_in_docs_is_generated_from_its_data_files():
    text = DOC.read_text(encoding='utf-8')
    assert text.count(START) == 1 and text.count(END) == 1, f'{DOC}: markers {START} {END}'
    documented = text.split(START, 1)[1].split(END, 1)[0].strip()
    expected = fit_table.markdown_table([str(REPO / f) for f in FILES], str(REPO / 'docs'))
    assert documented == expected.strip(), (
        f'the fit table in {DOC} differs from {FILES}: paste the output of '
        "fit_table.markdown_table(FILES, 'docs') between the markers")


def test_a_changed_data_file_changes_the_table(tmp_path):
    import json
    data = json.loads((REPO / FILES[0]).read_text())
    data['budgets'][0]['choice']['samples_per_s'] += 1.0
    changed = tmp_path / 'changed.json'
    changed.write_text(json.dumps(data))
    original = fit_table.markdown_table([str(REPO / FILES[0])], str(REPO / 'docs'))
    assert fit_table.markdown_table([str(changed)], str(REPO / 'docs')) != original
