import gzip
import json
from collections import Counter

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from mmdet3d_scaling.diagnostics.step_stages import (OUTSIDE, BusyTime, StepRange,
                                                     device_activities,
                                                     gpu_activity_by_device,
                                                     innermost_segments,
                                                     labelled_stages, stage_table)
from mmdet3d_scaling.diagnostics.train_step_benchmark import write_trace


def test_busy_time_counts_overlapping_kernels_once():
    busy = BusyTime([(0, 10), (5, 15), (20, 30)])
    assert busy.within(0, 40) == 25
    assert busy.within(12, 22) == 5
    assert busy.within(15, 20) == 0
    assert BusyTime([]).within(0, 10) == 0


def test_innermost_range_names_each_piece():
    pieces = innermost_segments([(0, 100, 'step'), (10, 40, 'loss'), (20, 30, 'forward')],
                                0, 120)
    named = [(a, b, n) for a, b, n in pieces]
    assert named == [(0, 10, 'step'), (10, 20, 'loss'), (20, 30, 'forward'),
                     (30, 40, 'loss'), (40, 100, 'step'), (100, 120, OUTSIDE)]


class TwoLayers(nn.Module):

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(32, 32)
        self.second = nn.Linear(32, 1)

    def forward(self, x):
        return self.second(self.first(x).relu()).sum()


class Wrapper:
    """The optim wrapper's three calls the stages label."""

    def __init__(self, model):
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def backward(self, loss):
        loss.backward()

    def step(self):
        self.optimizer.step()

    def zero_grad(self):
        self.optimizer.zero_grad()


def test_stage_table_of_a_real_profile_covers_the_steps_and_undoes_the_labels():
    model, step = TwoLayers(), StepRange()
    wrapper = Wrapper(model)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with labelled_stages(model, wrapper):
            for _ in range(3):
                step.open()
                loss = model(torch.randn(64, 32))
                wrapper.backward(loss)
                wrapper.step()
                wrapper.zero_grad()
                step.close()
                torch.randn(200, 200).sum()  # between steps
    assert 'forward' not in vars(model.first) and 'backward' not in vars(wrapper)
    rows = {r['stage']: r for r in stage_table(prof)}
    assert {'first.forward', 'second.forward', 'backward', 'optimizer.step', 'zero_grad',
            '(step, unlabelled)', OUTSIDE} <= set(rows)
    assert all(r['busy_ms_per_iter'] == 0 for r in rows.values())  # CPU: no kernels
    ops = {o['name'] for o in rows['first.forward']['top_host_ops']}
    assert 'aten::addmm' in ops or 'aten::linear' in ops
    assert rows[OUTSIDE]['wall_ms_per_iter'] > 0


def test_no_labelled_step_gives_an_empty_table():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(3).sum()
    assert stage_table(prof) == []


class Head(nn.Module):
    """An mmdet-style dense head: loss_and_predict = forward + loss_by_feat +
    predict_by_feat, each called through ``self`` as mmdet's heads call them."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Linear(16, 4)

    def forward(self, x):
        return self.conv(x)

    def loss_by_feat(self, out):
        return out.pow(2).mean()

    def predict_by_feat(self, out):
        return out.detach().topk(2, dim=1)[1]

    def loss_and_predict(self, x):
        out = self(x)
        glue = torch.randn(300, 300).sum()  # the method's own time
        return self.loss_by_feat(out) + 0 * glue, self.predict_by_feat(out)


class Detector(nn.Module):

    def __init__(self):
        super().__init__()
        self.rpn_head = Head()


def test_a_heads_loss_and_predict_splits_into_its_loss_and_its_proposals():
    model, step = Detector(), StepRange()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with labelled_stages(model, Wrapper(model)):
            for _ in range(2):
                step.open()
                model.rpn_head.loss_and_predict(torch.randn(32, 16))
                step.close()
        assert 'predict_by_feat' not in vars(model.rpn_head)
    rows = {r['stage']: r for r in stage_table(prof)}
    for stage in ('forward', 'loss_by_feat', 'predict_by_feat', 'loss_and_predict'):
        assert rows[f'rpn_head.{stage}']['wall_ms_per_iter'] > 0, stage
    ops = {o['name'] for o in rows['rpn_head.predict_by_feat']['top_host_ops']}
    assert 'aten::topk' in ops
    glue = {o['name'] for o in rows['rpn_head.loss_and_predict']['top_host_ops']}
    assert 'aten::topk' not in glue and 'aten::normal_' in glue  # randn's fill


class Recording(nn.Module):
    """A child whose forward notes the stage the labels say is open."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, stages):
        self.seen.append(stages.current())
        return torch.zeros(())


class Nested(nn.Module):

    def __init__(self, seen):
        super().__init__()
        self.inner = Recording(seen)


def test_open_stages_name_the_innermost_stage_and_close_with_it():
    seen = []
    model = Nested(seen)
    with labelled_stages(model, Wrapper(model)) as stages:
        assert stages.current() == OUTSIDE
        model.inner(stages)
        stages.open.append('step')  # what the train-step probe opens around a step
        assert stages.current() == '(step, unlabelled)'
        model.inner(stages)
        stages.open.pop()
        assert stages.current() == OUTSIDE
    assert seen == ['inner.forward', 'inner.forward']


def test_a_stage_that_raises_is_closed():
    class Raising(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self):
            raise ValueError('bad batch')

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = Raising()

    model = Model()
    with labelled_stages(model, Wrapper(model)) as stages:
        with pytest.raises(ValueError, match='bad batch'):
            model.head()
        assert stages.open == []


def _graph_of(fn, x):
    """A CUDA graph of ``fn(x)`` (captured after a warm-up on a side stream)."""
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        fn(x)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(x)
    return graph


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_device_activities_are_the_traces_on_every_stream_and_in_graphs(tmp_path):
    """Kernels of the default stream, of a side stream (forward and its backward, which
    autograd's device thread launches) and of a graph replay: as many, and as long, as
    the Chrome trace's GPU activities."""
    x = torch.randn(256, 256, device='cuda')
    w = torch.randn(256, 256, device='cuda', requires_grad=True)
    graph = _graph_of(lambda t: (t @ t).relu(), x)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, \
            record_function('stage:annotated'):  # a GPU user annotation, not a kernel
        (x @ x).sin()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            (x @ w).exp().sum().backward()
        torch.cuda.current_stream().wait_stream(side)
        graph.replay()
        torch.cuda.synchronize()
    activities = device_activities(prof)
    assert len({a.stream for a in activities}) >= 2
    write_trace(prof, str(tmp_path / 'trace.json.gz'))
    with gzip.open(tmp_path / 'trace.json.gz') as f:
        trace = json.load(f)['traceEvents']
    gpu = [e for e in trace if e.get('cat') in ('kernel', 'gpu_memcpy', 'gpu_memset')]
    theirs = Counter(e['name'] for e in gpu)
    events = prof.profiler.kineto_results.events()
    by_device = gpu_activity_by_device(events)  # torch 2.11's way, checked on any torch
    for ours in (Counter(a.name for a in activities),
                 Counter(e.name() for e in events if by_device(e))):
        assert ours == theirs, (ours - theirs, theirs - ours)
    assert sum(a.stop - a.start for a in activities) == pytest.approx(
        sum(e['dur'] for e in gpu), rel=1e-3)


def test_gpu_activities_of_a_cpu_profile_are_none_either_way():
    """Both tests of a GPU activity run on real kineto events of this torch (the one by
    device for torch 2.11 reads only methods its events have) and find none on a CPU."""
    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function('stage:a'):
        (x @ x).sin()
    events = prof.profiler.kineto_results.events()
    assert any(e.is_user_annotation() for e in events)
    assert device_activities(prof) == []
    assert not any(gpu_activity_by_device(events)(e) for e in events)
