"""The table of every config file in docs/configs.md, computed from the files.

Each file is loaded and planned by ``prepare_config`` (what the Runner runs) for the GPU
count its name says (``{N}xb{B}``; 1, a plain ``python tools/train.py``, when the name
has none). ``tests/configs/test_config_library.py`` checks that docs/configs.md holds
exactly this table; rewrite it there with::

    python -m tests.configs.config_table
"""
import copy
import glob
import os
import os.path as osp
import re
from typing import Dict, List, Optional

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = osp.join(REPO, 'configs')
HEADER = ('| config | family | per-GPU batch x GPUs x accumulation | effective batch | LR '
          '| precision | alias of |\n|---|---|---|---|---|---|---|')
FAMILY_BY_PREFIX = (
    ('bevfusion_lidar-cam', 'BEVFusion LiDAR-camera'), ('bevfusion_1gpu', 'BEVFusion '
                                                        'LiDAR-camera'),
    ('bevfusion_lidar', 'BEVFusion LiDAR'), ('pv_rcnn', 'PV-RCNN'), ('second', 'SECOND'),
    ('pointpillars', 'PointPillars'))


def config_files() -> List[str]:
    """Every config under configs/ except the ``_base_`` fragments, relative, sorted."""
    paths = glob.glob(osp.join(CONFIGS, '**', '*.py'), recursive=True)
    return sorted(osp.relpath(p, CONFIGS) for p in paths
                  if '_base_' not in p.split(osp.sep))


def alias_target(rel: str) -> Optional[str]:
    """The file an alias (a file whose first line starts with ``# Alias``, then comments
    and one ``_base_`` line) names, relative to configs/; None for other files."""
    path = osp.join(CONFIGS, rel)
    text = open(path).read()
    code = [line for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith('#')]
    match = re.fullmatch(r"_base_ = \['([^']+)'\]", code[0]) if len(code) == 1 else None
    if not text.startswith('# Alias') or match is None:
        return None
    return osp.relpath(osp.normpath(osp.join(osp.dirname(path), match.group(1))), CONFIGS)


def gpus_named(rel: str) -> int:
    match = re.search(r'_(\d+)xb\d+', osp.basename(rel))
    return int(match.group(1)) if match else 1


def family(rel: str) -> str:
    name = osp.basename(rel)
    for prefix, label in FAMILY_BY_PREFIX:
        if name.startswith(prefix):
            return label
    return 'demo'


AMP_NAMES = {'float16': 'AMP fp16', 'bfloat16': 'AMP bf16',
             'auto': 'AMP bf16 or fp16 by the GPU'}


def precision(cfg) -> str:
    """Mixed precision as the file asks for it (``fp16`` / ``amp`` keys or an
    ``AmpOptimWrapper``), before ``amp.dtype='auto'`` is resolved on this machine."""
    amp = cfg.get('amp')
    if cfg.get('fp16'):
        name = AMP_NAMES['float16']
    elif amp:
        name = AMP_NAMES[amp.get('dtype', 'float16') if isinstance(amp, dict)
                         else 'float16']
    elif 'Amp' in cfg.optim_wrapper.get('type', ''):
        name = AMP_NAMES[str(cfg.optim_wrapper.get('dtype') or 'float16')]
    else:
        name = 'fp32'
    if cfg.get('float32_matmul_precision') in ('high', 'medium'):
        name += ' + TF32 matmul'
    return name


def planned(rel: str) -> Dict[str, str]:
    """One row: the plan prepare_config makes for the file at its named GPU count."""
    from mmengine.config import Config

    from mmdet3d_scaling.config.preparation import prepare_config
    n = gpus_named(rel)
    env = dict(RANK='0', LOCAL_RANK='0', WORLD_SIZE=str(n), MASTER_ADDR='127.0.0.1',
               MASTER_PORT='29500')
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        raw = Config.fromfile(osp.join(CONFIGS, rel))
        cfg = copy.deepcopy(raw)
        cfg.launcher = 'pytorch' if n > 1 else 'none'
        cfg.preflight = dict(check_data=False)  # the datasets are not needed to plan
        cfg = prepare_config(cfg)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    wrapper = cfg.optim_wrapper
    batch = cfg.train_dataloader.batch_size
    acc = wrapper.get('accumulative_counts', 1)
    target = alias_target(rel)
    return dict(config=f'`{rel}`', family=family(rel),
                plan=f'{batch} x {n} x {acc}' + ('' if re.search(r'_\d+xb\d+', rel)
                                                 else ' (1 GPU)'),
                total=str(batch * n * acc), lr=f'{wrapper.optimizer.lr:g}',
                precision=precision(raw), alias=f'`{target}`' if target else '')


def table() -> str:
    rows = [planned(rel) for rel in config_files()]
    return HEADER + '\n' + '\n'.join(
        f"| {r['config']} | {r['family']} | {r['plan']} | {r['total']} | {r['lr']} | "
        f"{r['precision']} | {r['alias']} |" for r in rows)


DOC = osp.join(REPO, 'docs', 'configs.md')
START, END = '<!-- config-table:start -->', '<!-- config-table:end -->'


def doc_table(path: str = DOC) -> str:
    """The table between the markers of docs/configs.md."""
    text = open(path).read()
    return text[text.index(START) + len(START):text.index(END)].strip()


def write_doc(path: str = DOC) -> None:
    text = open(path).read()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    with open(path, 'w') as f:
        f.write(f'{head}{START}\n{table()}\n{END}{tail}')


if __name__ == '__main__':
    import mmdet3d_scaling  # noqa: F401  (registries, as the Runner has them)
    write_doc()
    print(f'written: {DOC}')
