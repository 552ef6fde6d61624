"""What an mmdet3d 1.x info file looks like, and how to convert one from before 1.0.

Shared by the preflight (``config/data_files.py``) and the ``info_files`` fix, which
names a pre-1.0 info file where mmengine loads it.
"""
import os.path as osp
from typing import Optional

UPDATE_INFOS = 'tools/dataset_converters/update_infos_to_v2.py'


def info_structure_problem(obj: object) -> Optional[str]:
    """Why a loaded info file is not an mmdet3d 1.x info file; None when it is."""
    if isinstance(obj, dict) and 'data_list' in obj and 'metainfo' in obj:
        if isinstance(obj['data_list'], list):
            return None
        return f'its data_list is a {type(obj["data_list"]).__name__}, not a list'
    if isinstance(obj, list) or (isinstance(obj, dict) and 'infos' in obj):
        shape = ('a bare list' if isinstance(obj, list) else
                 f'a dict with keys {sorted(map(str, obj))}')
        return (f'is {shape}: the info format of mmdet3d before 1.0, which mmdet3d 1.x '
                'cannot read')
    keys = f' with keys {sorted(map(str, obj))}' if isinstance(obj, dict) else ''
    return (f'is a {type(obj).__name__}{keys}, not an mmdet3d 1.x info file (a dict with '
            "'data_list' and 'metainfo')")


def update_hint(path: str, dataset_type: str) -> str:
    """How to convert a pre-1.0 info file ``path`` of ``dataset_type``."""
    name = dataset_type.replace('Dataset', '').lower() or 'kitti'
    folder = osp.dirname(path) or '.'
    return (f"convert it with mmdet3d's `python {UPDATE_INFOS} --dataset {name} "
            f'--pkl-path {path} --out-dir {osp.join(folder, "v2")}` (in an mmdet3d '
            'checkout; pip installs it under mmdet3d/.mim/) and point ann_file at '
            f'{osp.join(folder, "v2", osp.basename(path))}'
            ", or create the infos again with mmdet3d 1.x's tools/create_data.py")
