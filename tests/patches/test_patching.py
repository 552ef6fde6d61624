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
        name='_test_first', kind='speed', targets=('Owner.f',), upstream='torch>=1', why='-',
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


def test_upstream_must_be_a_version_range():
    with pytest.raises(ValueError, match=r"patch _test_label: upstream 'mmdet3d 1\.4\.0' "
                                         r"is not a package with a version range.*"
                                         r"'mmdet3d==1\.4\.0'"):
        patching.Patch(name='_test_label', kind='speed', targets=('x',),
                       upstream='mmdet3d 1.4.0', why='-', changes=list)
    with pytest.raises(ValueError, match="upstream 'mmdet3d' is not a package with"):
        patching.Patch(name='_test_label', kind='speed', targets=('x',),
                       upstream=('mmengine>=0.10', 'mmdet3d'), why='-', changes=list)


@pytest.mark.slow
def test_a_patch_outside_its_version_range_is_reported_not_applied(tmp_path):
    """The real max_iou_assigner record, declared for an mmdet other than the installed
    one: not applied, upstream's method stays, and the table and the runner's start-up
    table say why; a runner that selects it builds and trains on upstream's method."""
    import dataclasses

    from mmengine.config import Config
    from mmengine.registry import RUNNERS

    from mmdet3d_scaling.engine.runner import patch_table
    from tests.toy import toy_runner_cfg

    record = patching.PATCHES['max_iou_assigner']
    installed = patching.installed_version('mmdet')
    was_applied = 'max_iou_assigner' in patching.applied()
    patching.revert([record.name])
    upstream = MaxIoUAssigner.__dict__['assign_wrt_overlaps']
    patching.declare(dataclasses.replace(record, upstream=('mmdet==0.1.0',)))
    try:
        assert patching.apply(['max_iou_assigner']) == []
        assert MaxIoUAssigner.__dict__['assign_wrt_overlaps'] is upstream
        why = f'mmdet {installed} installed, written for mmdet==0.1.0'
        assert patching.not_applied()['max_iou_assigner'] == why
        assert f'NOT APPLIED: {why}' in patching.table(['max_iou_assigner'])
        assert f'NOT APPLIED: {why}' in patch_table(['max_iou_assigner'])
        assert patching.outside_range() == {'max_iou_assigner': why}
        with pytest.warns(UserWarning, match=f'max_iou_assigner: {why}'):
            patching.warn_outside_range()
        runner = RUNNERS.build(Config(toy_runner_cfg(
            tmp_path, max_iters=1, runner_type='ScalingRunner',
            patches=['max_iou_assigner'])))
        runner.train()
        assert MaxIoUAssigner.__dict__['assign_wrt_overlaps'] is upstream
        assert 'max_iou_assigner' not in patching.applied()
    finally:
        patching.declare(record)
        patching._not_applied.pop('max_iou_assigner', None)
        if was_applied:
            patching.apply(['max_iou_assigner'])
    assert patching.version_mismatch(record) is None  # the real range fits this install


def test_a_missing_package_is_reported():
    patch = patching.Patch(name='_test_missing', kind='speed', targets=('x',),
                           upstream='not-a-package-here>=1', why='-', changes=list)
    assert patching.version_mismatch(patch) == 'not-a-package-here not installed'
