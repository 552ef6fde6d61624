"""The patch mechanism: sets, apply / revert, skip variable, table, errors."""

import pytest
from mmdet.models.task_modules.assigners import MaxIoUAssigner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.patches.speed import max_iou_assigner


def test_every_patch_is_declared_with_kind_targets_and_reason():
    assert list(patching.PATCHES)  # declared on import
    for patch in patching.PATCHES.values():
        assert patch.kind in patching.KINDS
        assert patch.targets and patch.upstream and patch.why, patch.name


def test_sets_resolve_to_patch_names_in_declaration_order():
    speed = patching.resolve(['speed'])
    assert 'max_iou_assigner' in speed and 'checkpoint' not in speed
    assert patching.resolve(['fixes', 'roi_assign'])[-1] == 'roi_assign'
    with pytest.raises(ValueError, match=r"unknown patch or patch set 'sped'.*fixes, cpu, "
                                         r'speed'):
        patching.resolve(['sped'])


def test_apply_then_revert_restores_upstream_exactly():
    upstream = MaxIoUAssigner.__dict__.get('assign_wrt_overlaps')
    was_applied = 'max_iou_assigner' in patching.applied()
    patching.revert(['max_iou_assigner'])
    assert MaxIoUAssigner.__dict__.get('assign_wrt_overlaps') is (
        max_iou_assigner.assign_wrt_overlaps.original if was_applied else upstream)
    assert patching.apply(['max_iou_assigner']) == ['max_iou_assigner']
    assert MaxIoUAssigner.assign_wrt_overlaps is max_iou_assigner.assign_wrt_overlaps
    assert patching.original('max_iou_assigner', 'assign_wrt_overlaps') is (
        max_iou_assigner.assign_wrt_overlaps.original)
    patching.revert(['max_iou_assigner'])
    assert MaxIoUAssigner.assign_wrt_overlaps is max_iou_assigner.assign_wrt_overlaps.original
    if was_applied:
        patching.apply(['max_iou_assigner'])


def test_revert_refuses_to_undo_a_later_change():
    owner = type('Owner', (), {'f': lambda self: 1})
    first = patching.declare(patching.Patch(
        name='_test_first', kind='speed', targets=('Owner.f',), upstream='-', why='-',
        changes=lambda: [patching.Change(owner, 'f', lambda self: 2)]))
    try:
        patching.apply([first.name])
        owner.f = lambda self: 3  # someone else, after the patch
        with pytest.raises(RuntimeError, match='cannot revert patch _test_first'):
            patching.revert([first.name])
    finally:
        patching._applied.pop(first.name, None)
        patching.PATCHES.pop(first.name)


def test_skip_variable_keeps_a_patch_off(monkeypatch):
    was_applied = 'rpn_proposal_nms' in patching.applied()
    patching.revert(['rpn_proposal_nms'])
    monkeypatch.setenv(patching.SKIP_ENV, 'rpn_proposal_nms')
    assert 'rpn_proposal_nms' not in patching.apply(['speed'])
    monkeypatch.setenv(patching.SKIP_ENV, 'rpn_proposal_nmss')
    with pytest.raises(ValueError, match=r"unknown patch\(es\) \['rpn_proposal_nmss'\]"):
        patching.apply(['speed'])
    monkeypatch.delenv(patching.SKIP_ENV)
    if was_applied:
        patching.apply(['rpn_proposal_nms'])


def test_cpu_patches_are_skipped_where_cuda_is_available():
    cpu = patching.resolve(['cpu'])
    if patching.cuda_available():  # the set applies nothing there (a name on its own may)
        assert patching.apply(['cpu']) == []
    else:
        needed = [n for n in cpu if patching.PATCHES[n].needed()]
        assert set(needed) <= set(patching.applied())


def test_table_lists_state_and_reason():
    text = patching.table()
    assert text.splitlines()[0].split()[:4] == ['patch', 'kind', 'upstream', 'state']
    assert 'checkpoint' in text and 'applied' in text
