"""The loader's ground truth, kept on the host beside the copy the model gets.

BEVFusion draws its heatmap targets on the host. Read back from the GPU, the boxes
come only after everything queued before them: the heatmap thread waited 37-41 ms a
micro-batch for that copy in call I1 (one H100, the 1xb4 config), behind the previous
step's work. The data preprocessor therefore keeps each training sample's ground
truth as the loader made it, on the host, in the sample's metainfo under
:data:`HOST_GT_KEY`; the head reads it there and copies nothing back. It is valid as
long as nothing changes the ground truth between the preprocessor and the loss
(nothing in BEVFusion does).
"""
from typing import List, Optional, Sequence

HOST_GT_KEY = 'gt_instances_3d_host'


def keep_host_ground_truth(samples: Sequence) -> None:
    """Put each sample's ``gt_instances_3d``, where it is on the host, in its metainfo
    under :data:`HOST_GT_KEY` (the sample's copy to the device carries it along). Set
    as a field, not through ``set_metainfo``, which would deep-copy it once more."""
    for sample in samples:
        gt = sample.get('gt_instances_3d')
        if gt is not None and 'bboxes_3d' in gt and not gt.bboxes_3d.tensor.is_cuda:
            sample.set_field(gt, HOST_GT_KEY, field_type='metainfo')


def host_ground_truth(samples: Sequence) -> Optional[List]:
    """The samples' host ground truth, or None where one of them has none."""
    found = [s.metainfo.get(HOST_GT_KEY) for s in samples]
    return None if any(g is None for g in found) else found
