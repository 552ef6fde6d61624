"""The fastest fit's search: memory budgets, the preference order, the choice,
and gradient checkpointing switched on a real (reduced) BEVFusion with a modelled
device whose memory per sample depends on the checkpointing in force."""
import pytest
import torch
from mmengine.optim import OptimWrapper

from mmdet3d_scaling.batch_size.checkpoint_switch import CheckpointSwitch
from mmdet3d_scaling.batch_size.fastest_fit import (FastestFitFinder, FitResult, FitTrial,
                                                    Variant, choose, preference_order)
from mmdet3d_scaling.batch_size.memory_probe import ModeledCheckpointingProbe
from mmdet3d_scaling.utils.memory_size import parse_memory_budget

GiB, MiB = 2**30, 2**20


# ---------------------------------------------------------------------------- budget
@pytest.mark.parametrize('value,expected', [
    (24, 24 * GiB), (22.5, int(22.5 * GiB)), ('24GiB', 24 * GiB), ('24 GiB', 24 * GiB),
    (' 24gib ', 24 * GiB), ('1536MiB', 1536 * MiB), ('24GB', 24 * 10**9),
    ('500 MB', 500 * 10**6), ('0.5GiB', GiB // 2)])
def test_memory_budget_values(value, expected):
    assert parse_memory_budget(value) == expected


@pytest.mark.parametrize('value', [0, -4, True, '24', '24 GiBs', 'lots', '-1GiB',
                                   float('nan'), float('inf'), None, [24], '0.5KiB',
                                   0.0000001])
def test_bad_memory_budgets_are_named(value):
    with pytest.raises(ValueError) as err:
        parse_memory_budget(value, 'scaling.memory_budget')
    message = str(err.value)
    assert f'scaling.memory_budget={value!r}' in message
    assert "'24GiB'" in message or 'GiB' in message  # says what is accepted


# ----------------------------------------------------------- order and the choice
def test_preference_order_large_batches_first_without_checkpointing_first():
    order = preference_order([1, 4, 2], can_checkpoint=True)
    assert [a.label() for a in order] == [
        'batch 4, checkpointing off', 'batch 4, checkpointing on',
        'batch 2, checkpointing off', 'batch 2, checkpointing on',
        'batch 1, checkpointing off', 'batch 1, checkpointing on']
    assert preference_order([2, 4, 4], can_checkpoint=False) == [
        Variant(4, False), Variant(2, False)]


def test_choose_the_fastest_that_fits():
    # batch 4 without checkpointing does not fit; batch 4 with it is slower than 2
    assert choose([None, 5.0, 6.0, 5.5], min_gain=0.0) == 2
    assert choose([None, None]) is None
    # an earlier variant keeps the pick unless a later one is faster by min_gain
    assert choose([6.0, 6.1], min_gain=0.02) == 0
    assert choose([6.0, 6.2], min_gain=0.02) == 1
    assert choose([6.0, 6.0], min_gain=0.0) == 0  # ties: the preferred one


def test_fit_result_round_trips_through_json_form():
    trial = FitTrial(4, False, True, False, 6.1, 17 * GiB, 19 * GiB, 3.0)
    result = FitResult(4, False, 6.1, 17 * GiB, 19 * GiB, 24 * GiB, int(21.6 * GiB), 0.1,
                       'dev', 12.0, [trial])
    again = FitResult.from_dict(result.to_dict())
    assert again == result and again.trials[0].variant == Variant(4, False)


# ------------------------------------------------ a real BEVFusion with checkpointing
@pytest.fixture(scope='module')
def bevfusion():
    """The reduced LiDAR-camera BEVFusion of the model tests, with the Swin blocks, the
    neck and the view transform checkpointed as configs/bevfusion_1gpu.py has them."""
    pytest.importorskip('spconv.pytorch')
    from tests.models.bevfusion import common as cam
    from tests.models.bevfusion.common import build, toy_batch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = cam.camera_cfg(with_cp=True, memory_efficient=True)
    cfg['img_backbone']['with_cp'] = True
    cfg['img_neck']['with_cp'] = True
    torch.manual_seed(0)
    model = build(cfg).train()

    def make_batch(n: int) -> dict:
        batch = toy_batch(seed=0, batch_size=n)
        g = torch.Generator().manual_seed(0)
        batch['inputs']['img'] = [torch.rand(cam.CAMS, 3, *cam.IMAGE, generator=g) * 255
                                  for _ in batch['data_samples']]
        for sample in batch['data_samples']:
            sample.set_metainfo(cam.camera_metas())
        return batch

    yield model, make_batch
    torch.set_num_threads(threads)


def _forward_calls(model, module, batch) -> int:
    """Forwards of ``module`` in one training step (inside a checkpointed module it
    runs again in the backward pass)."""
    calls = []
    handle = module.register_forward_hook(lambda *_: calls.append(1))
    try:
        data = model.data_preprocessor(batch, True)
        losses = model(**data, mode='loss')
        sum(v for k, v in losses.items() if 'loss' in k).backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    return len(calls)


@pytest.mark.slow
def test_checkpoint_switch_turns_the_configured_checkpointing_off_and_on(bevfusion):
    model, make_batch = bevfusion
    switch = CheckpointSwitch(model)
    names = [n for n, _ in switch.flagged]
    assert switch.available
    assert 'view_transform' in names and 'img_neck' in names
    assert any(n.startswith('img_backbone.stages.') for n in names)  # Swin blocks
    assert 'img_backbone' in switch.describe()
    # a Swin block checkpoints its inner forward: its attention runs again in backward
    block = dict(model.named_modules())[next(
        n for n in names if n.startswith('img_backbone.stages.'))].attn
    batch = make_batch(1)
    assert _forward_calls(model, block, batch) == 2  # recomputed in backward
    switch.set(False)
    try:
        assert not switch.is_on
        assert not any(m.with_cp for _, m in switch.flagged)
        assert _forward_calls(model, block, batch) == 1
    finally:
        switch.set(True)
    assert all(m.with_cp for _, m in switch.flagged) and switch.is_on
    assert _forward_calls(model, block, batch) == 2


@pytest.mark.slow
def test_checkpoint_switch_without_checkpointing(bevfusion):
    model, _ = bevfusion
    switch = CheckpointSwitch(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert not switch.available and switch.describe() == 'none'
    with pytest.raises(ValueError, match='without any'):
        FastestFitFinder(model, None, lambda n: None, None, switch,
                          [Variant(1, True)])


@pytest.mark.slow
def test_finder_picks_the_fastest_that_fits_and_restores_the_model(bevfusion):
    """Modelled device: 100 MiB budget, 10 % margin -> 90 MiB; 30 MiB a sample without
    checkpointing, 12 MiB with it: batch 4 fits only with checkpointing, batch 2 and 1
    either way. The pick is the fastest measured among those that fit."""
    model, make_batch = bevfusion
    switch = CheckpointSwitch(model)
    optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = ModeledCheckpointingProbe(
        model, capacity_bytes=GiB, fixed_bytes=0, bytes_per_sample=30 * MiB,
        checkpointed_bytes_per_sample=12 * MiB)
    # a graph a trial captured (a stand-in here: the CPU runs eagerly) goes with it
    model._graph_cache.graphs[('img_encoder', ())] = torch.nn.Identity()
    try:
        finder = FastestFitFinder(
            model, optim, make_batch, probe, switch,
            preference_order([4, 2], can_checkpoint=True), budget_bytes=100 * MiB,
            margin=0.1, warmup_steps=1, timed_steps=1, min_gain=0.0)
        result = finder.search()
    finally:
        probe.detach()
    trials = {t.variant: t for t in result.trials}
    assert [t.variant for t in result.trials] == preference_order([4, 2], True)
    assert trials[Variant(4, False)].oom and not trials[Variant(4, False)].fits
    assert trials[Variant(4, False)].samples_per_s is None
    fitting = [t for t in result.trials if t.fits]
    assert {t.variant for t in fitting} == {
        Variant(4, True), Variant(2, False), Variant(2, True)}
    assert all(t.samples_per_s > 0 and t.peak_reserved_bytes <= 90 * MiB
               for t in fitting)
    fastest = max(fitting, key=lambda t: t.samples_per_s)
    assert result.variant == fastest.variant
    assert result.samples_per_s == fastest.samples_per_s
    assert result.budget_bytes == 100 * MiB and result.limit_bytes == 90 * MiB
    # the model is as built: weights back, checkpointing as configured
    assert switch.is_on and all(m.with_cp for _, m in switch.flagged)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not model._forward_pre_hooks
    assert model._graph_cache.graphs == {}


@pytest.mark.slow
def test_budget_above_the_device_is_lowered_to_it(bevfusion):
    model, make_batch = bevfusion
    probe = ModeledCheckpointingProbe(model, capacity_bytes=50 * MiB, fixed_bytes=0)
    try:
        finder = FastestFitFinder(model, None, make_batch, probe,
                                   CheckpointSwitch(model), [Variant(1, False)],
                                   budget_bytes=24 * GiB)
    finally:
        probe.detach()
    assert finder.budget_bytes == 50 * MiB
