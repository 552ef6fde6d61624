"""mim's model index (``model-index.yml``, ``configs/<family>/metafile.yml``) is complete,
points at files that exist, and quotes only figures its data files hold."""
import os.path as osp
from pathlib import Path
from typing import List, Tuple

import yaml

from tests.configs import metafiles
from tests.configs.config_table import CONFIGS, REPO, alias_target
from tests.docs import figure_rules

def _load(rel: str) -> dict:
    with open(osp.join(REPO, rel), encoding='utf-8') as f:
        return yaml.safe_load(f)


def _models() -> List[dict]:
    return [m for rel in _load(metafiles.MODEL_INDEX)['Import'] for m in _load(rel)['Models']]


def test_files_are_the_generated_ones():
    for rel, text in metafiles.expected_files().items():
        path = osp.join(REPO, rel)
        assert osp.isfile(path), f'{rel} is missing: python -m tests.configs.metafiles'
        assert open(path, encoding='utf-8').read() == text, (
            f'{rel} differs from what tests/configs/metafiles.py writes (a config, the '
            'config table or a measured result changed): python -m tests.configs.metafiles')


def test_index_imports_every_family_metafile():
    imports = _load(metafiles.MODEL_INDEX)['Import']
    assert imports == [f'configs/{f}/metafile.yml' for f in metafiles.FAMILIES]
    assert all(osp.isfile(osp.join(REPO, rel)) for rel in imports)


def test_every_model_points_to_an_existing_config_of_a_known_collection():
    collections = {c['Name'] for rel in _load(metafiles.MODEL_INDEX)['Import']
                   for c in _load(rel).get('Collections', [])}
    names = [m['Name'] for m in _models()]
    assert len(names) == len(set(names)), 'model names must be unique (mim keys by them)'
    for model in _models():
        assert osp.isfile(osp.join(REPO, model['Config'])), model['Config']
        assert model['Name'] == osp.splitext(osp.basename(model['Config']))[0]
        assert model['In Collection'] in collections, model['Name']
        assert {'Training Data', 'Training Resources', 'Batch Size per GPU',
                'Effective Batch Size'} <= set(model['Metadata']), model['Name']


def test_every_config_but_aliases_is_listed():
    listed = {m['Config'] for m in _models()}
    for family in metafiles.FAMILIES:
        for name in sorted(Path(CONFIGS, family).glob('*.py')):
            rel = f'{family}/{name.name}'
            if alias_target(rel) is None:
                assert f'configs/{rel}' in listed, f'configs/{rel} is in no metafile'
    assert 'configs/bevfusion_1gpu.py' in listed  # the documented short name


def _figures(model: dict) -> List[Tuple[str, float]]:
    """``(key, value)`` of every measured figure: result metrics and float metadata."""
    out = [(k, v) for result in model.get('Results', []) for k, v in result['Metrics'].items()]
    out += [(k, v) for k, v in model['Metadata'].items() if isinstance(v, float)]
    return out


def _problems(model: dict) -> List[str]:
    figures = _figures(model)
    if figures and not model.get('Data'):
        return [f'{model["Name"]}: figures without a data file']
    missing = [f for f in model.get('Data', []) if not osp.isfile(osp.join(REPO, f))]
    if missing:
        return [f'{model["Name"]}: data file {f} does not exist' for f in missing]
    pool = figure_rules.candidates(set().union(
        *(figure_rules.file_numbers(Path(REPO) / f) for f in model.get('Data', []))))
    problems = []
    for key, value in figures:
        text = repr(float(value))
        decimals = len(text.split('.')[1]) if '.' in text else 0
        figure = figure_rules.Figure(text, float(value), decimals, False)
        if not figure_rules.found(figure, pool, []):
            problems.append(f'{model["Name"]}: {key} = {value} is in none of {model["Data"]}')
    return problems


def test_measured_figures_are_in_their_data_files():
    models = [m for m in _models() if _figures(m)]
    assert {m['Name'] for m in models} >= {'pointpillars_synthetic_kitti_cpu',
                                           'pv_rcnn_synthetic_kitti', 'bevfusion_1gpu'}
    problems = [p for m in models for p in _problems(m)]
    assert not problems, '\n'.join(problems)


def test_a_changed_figure_is_caught():
    model = next(m for m in _models() if m['Name'] == 'pv_rcnn_synthetic_kitti')
    model['Metadata']['Training Speed (samples/s)'] = 17.94  # another run's figure
    assert _problems(model) == [
        'pv_rcnn_synthetic_kitti: Training Speed (samples/s) = 17.94 is in none of '
        "['docs/data/parity_pv_rcnn_200_steps_h200_partial.json', "
        "'docs/data/pv_rcnn_1gpu_speed_set_on_h200.json']"]
