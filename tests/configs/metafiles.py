"""mim's model index: ``model-index.yml`` and ``configs/<family>/metafile.yml``.

Written from the config table of docs/configs.md (which
``tests/configs/test_config_library.py`` keeps equal to the files) and from the measured
results below, each with the data file under docs/data that holds its figures.
``tests/configs/test_metafiles.py`` checks that the files on disk are this output;
rewrite them with::

    python -m tests.configs.metafiles

Listed: every config of a family folder except aliases (former names), plus the
documented short name ``configs/bevfusion_1gpu.py``.
"""
import os
import os.path as osp
import re
from typing import Dict, List, Tuple

import yaml

from tests.configs.config_table import CONFIGS, REPO, alias_target

FAMILIES = ('bevfusion', 'pv_rcnn', 'pointpillars', 'second', 'demo')
SHORT_NAMES = {'bevfusion': ['bevfusion_1gpu.py']}  # configs/ top level, listed anyway
MODEL_INDEX = 'model-index.yml'
TABLE = re.compile(r'^\| `([^`]+)` \| ([^|]+) \| (\d+) x (\d+) x (\d+)( \(1 GPU\))? \| (\d+) \|')

COLLECTIONS = {
    'bevfusion': [dict(
        Name='BEVFusion',
        Metadata={'Architecture': ['Swin Transformer', 'LSS view transform',
                                   'SECOND', 'TransFusion head']},
        Paper=dict(URL='https://arxiv.org/abs/2205.13542',
                   Title="BEVFusion: Multi-Task Multi-Sensor Fusion with Unified "
                         "Bird's-Eye View Representation"))],
    'pv_rcnn': [dict(
        Name='PV-RCNN',
        Metadata={'Architecture': ['Sparse convolution', 'Voxel set abstraction',
                                   'RoI-grid pooling']},
        Paper=dict(URL='https://arxiv.org/abs/1912.13192',
                   Title='PV-RCNN: Point-Voxel Feature Set Abstraction for 3D Object '
                         'Detection'))],
    'pointpillars': [dict(
        Name='PointPillars',
        Metadata={'Architecture': ['Hard voxelization', 'PillarFeatureNet', 'SECOND',
                                   'SECONDFPN']},
        Paper=dict(URL='https://arxiv.org/abs/1812.05784',
                   Title='PointPillars: Fast Encoders for Object Detection from Point '
                         'Clouds'))],
    'second': [dict(
        Name='SECOND',
        Metadata={'Architecture': ['Hard voxelization', 'Sparse convolution',
                                   'SECONDFPN']},
        Paper=dict(URL='https://www.mdpi.com/1424-8220/18/10/3337',
                   Title='SECOND: Sparsely Embedded Convolutional Detection'))],
    'demo': [],  # the demo's model is a reduced PointPillars: that collection
}
COLLECTION_OF = {'bevfusion': 'BEVFusion', 'pv_rcnn': 'PV-RCNN',
                 'pointpillars': 'PointPillars', 'second': 'SECOND', 'demo': 'PointPillars'}

# Measured results: config -> (training resources, results, extra metadata, data files).
# Every figure must be in one of the data files (tests/configs/test_metafiles.py).
MEASURED: Dict[str, Tuple[str, list, dict, List[str]]] = {
    'demo/pointpillars_synthetic_kitti_cpu.py': (
        'CPU (2 cores)',
        [dict(Task='3D Object Detection', Dataset='Synthetic KITTI',
              Metrics={'3D mAP, AP40 moderate (mean of 3 seeds)': 6.20,
                       'BEV mAP, AP40 moderate (mean of 3 seeds)': 9.57})],
        {}, ['docs/data/parity_pointpillars_demo_cpu_300.json']),
    'pv_rcnn/pv_rcnn_synthetic_kitti.py': (
        '1x H200',
        [dict(Task='3D Object Detection', Dataset='Synthetic KITTI',
              Metrics={'3D AP40 moderate (200 steps, 1 seed)': 0.64,
                       'BEV AP40 moderate (200 steps, 1 seed)': 1.48})],
        {'Training Speed (samples/s)': 17.34, 'Training Memory (GB)': 20.2},
        ['docs/data/parity_pv_rcnn_200_steps_h200_partial.json',
         'docs/data/pv_rcnn_1gpu_speed_set_on_h200.json']),
    'bevfusion/bevfusion_lidar_synthetic_nus_cpu.py': (
        'CPU (2 cores)',
        [dict(Task='3D Object Detection', Dataset='Synthetic nuScenes',
              Metrics={'mAP (mean of 6 seeds)': 0.245, 'NDS (mean of 6 seeds)': 0.245})],
        {}, ['docs/data/parity_bevfusion_lidar_cpu.json']),
    'bevfusion/bevfusion_lidar-cam_synthetic_nus_cpu.py': (
        '1x H200',
        [dict(Task='3D Object Detection', Dataset='Synthetic nuScenes',
              Metrics={'mAP (mean of 3 seeds, from the LiDAR-only checkpoint)': 0.630,
                       'NDS (mean of 3 seeds, from the LiDAR-only checkpoint)': 0.483})],
        {}, ['docs/data/parity_bevfusion_lidar-cam_amp_h200.json']),
    'bevfusion_1gpu.py': (
        '1x H200 (24 GiB cap)', [],
        {'Training Speed (samples/s)': 4.59, 'Training Memory (GB)': 6.00},
        ['docs/data/bevfusion_1gpu_amp_bf16_304.json']),
    'bevfusion/bevfusion_lidar_voxel0075_second_secfpn_1xb4-acc8-cyclic-20e_nus-3d.py': (
        '1x H200', [], {'Training Speed (samples/s)': 8.29},
        ['docs/data/scaling_h200_x2.json']),
    'bevfusion/bevfusion_lidar_voxel0075_second_secfpn_2xb4-acc4-cyclic-20e_nus-3d.py': (
        '2x H200', [], {'Training Speed (samples/s)': 16.27},
        ['docs/data/scaling_h200_x2.json']),
}


def table_rows() -> Dict[str, dict]:
    """docs/configs.md's config table: config -> family, batch, GPUs, accumulation."""
    rows = {}
    for line in open(osp.join(REPO, 'docs', 'configs.md'), encoding='utf-8'):
        match = TABLE.match(line)
        if match:
            rel, family, batch, gpus, acc, _, total = match.groups()
            rows[rel] = dict(family=family.strip(), batch=int(batch), gpus=int(gpus),
                             accumulation=int(acc), total=int(total))
    return rows


def listed_configs(family: str) -> List[str]:
    """The configs a family's metafile lists, relative to configs/."""
    names = sorted(n for n in os.listdir(osp.join(CONFIGS, family)) if n.endswith('.py'))
    configs = [f'{family}/{n}' for n in names if alias_target(f'{family}/{n}') is None]
    return configs + SHORT_NAMES.get(family, [])


def _training_data(rel: str) -> str:
    synthetic = 'synthetic' in rel or rel.startswith('demo/')
    dataset = 'nuScenes' if 'nus' in rel or rel.startswith('bevfusion') else 'KITTI'
    return f'Synthetic {dataset}' if synthetic else dataset


def _resources(rel: str, row: dict) -> str:
    if rel.endswith('_cpu.py'):
        return 'CPU'
    return f'{row["gpus"]}x GPU' + ('s' if row['gpus'] > 1 else '')


def model_entry(rel: str, family: str, row: dict) -> dict:
    """One ``Models`` entry of a metafile."""
    resources, results, extra, data = MEASURED.get(rel, (None, [], {}, []))
    resources = resources or _resources(rel, row)
    metadata = {'Training Data': _training_data(rel), 'Training Resources': resources}
    if not resources.startswith('CPU'):
        metadata['GPUs'] = row['gpus']
    metadata.update({'Batch Size per GPU': row['batch'], 'Accumulation': row['accumulation'],
                     'Effective Batch Size': row['total']})
    metadata.update(extra)
    entry = {'Name': osp.splitext(osp.basename(rel))[0],
             'In Collection': COLLECTION_OF[family],
             'Config': f'configs/{rel}', 'Metadata': metadata}
    if results:
        entry['Results'] = results
    if data:
        entry['Data'] = data  # where the figures come from, in the repository
    return entry


def metafile(family: str) -> dict:
    rows = table_rows()
    missing = [rel for rel in listed_configs(family) if rel not in rows]
    if missing:
        raise KeyError(f'{missing} not in the config table of docs/configs.md: regenerate '
                       'it with python -m tests.configs.config_table')
    content = {}
    if COLLECTIONS[family]:
        content['Collections'] = COLLECTIONS[family]
    content['Models'] = [model_entry(rel, family, rows[rel]) for rel in listed_configs(family)]
    return content


def render(content: dict) -> str:
    return yaml.safe_dump(content, sort_keys=False, allow_unicode=True, width=100)


def expected_files() -> Dict[str, str]:
    """Repository path -> text of the model index and every metafile."""
    files = {MODEL_INDEX: render({'Import': [f'configs/{f}/metafile.yml' for f in FAMILIES]})}
    for family in FAMILIES:
        files[f'configs/{family}/metafile.yml'] = render(metafile(family))
    return files


def main() -> None:
    for rel, text in expected_files().items():
        with open(osp.join(REPO, rel), 'w', encoding='utf-8') as f:
            f.write(text)
        print('wrote', rel)


if __name__ == '__main__':
    main()
