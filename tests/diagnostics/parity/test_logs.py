"""Reading a run back (mmdet3d_scaling.diagnostics.parity.logs): the loss per optimizer
step from mmengine's scalars, the headline test metrics."""
import json

import pytest

from mmdet3d_scaling.diagnostics.parity.errors import ParityError
from mmdet3d_scaling.diagnostics.parity.logs import headline_metrics, loss_per_step


def test_loss_per_step_averages_each_accumulation_window(tmp_path):
    log_dir = tmp_path / '20260101_000000'
    (log_dir / 'vis_data').mkdir(parents=True)
    (log_dir / '20260101_000000.log').write_text('')
    lines = [dict(lr=0.1, loss=float(i), iter=i, step=i) for i in range(1, 9)]
    (log_dir / 'vis_data' / 'scalars.json').write_text(
        '\n'.join(json.dumps(line) for line in lines))
    assert loss_per_step(str(tmp_path), 4) == [2.5, 6.5]
    assert loss_per_step(str(tmp_path), 1) == [float(i) for i in range(1, 9)]

def test_headline_metrics():
    prefix = 'Kitti metric/pred_instances_3d/KITTI/'
    got = headline_metrics({prefix + 'Overall_3D_AP40_moderate': 3.0,
                                   prefix + 'Car_BEV_AP40_moderate_strict': 9.0,
                                   prefix + 'Car_BEV_AP40_moderate_loose': 20.0})
    assert got == {'3D_AP40_moderate': 3.0, 'Car_BEV_AP40_moderate': 9.0}
    assert headline_metrics({'NuScenes metric/pred_instances_3d_NuScenes/NDS': 0.4,
                                    'NuScenes metric/pred_instances_3d_NuScenes/mAP': 0.3}
                                   ) == {'NDS': 0.4, 'mAP': 0.3}
    with pytest.raises(ParityError, match='no KITTI AP40 moderate'):
        headline_metrics({'accuracy': 1.0})
