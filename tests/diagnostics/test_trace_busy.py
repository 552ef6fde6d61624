"""diagnostics/trace_busy.py: busy share and idle time by stage from a saved trace."""
import gzip
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from mmdet3d_scaling.diagnostics.step_stages import StepRange
from mmdet3d_scaling.diagnostics.trace_busy import load_trace, trace_busy
from mmdet3d_scaling.diagnostics.train_step_benchmark import write_trace


def _range(name, ts, dur):
    return dict(ph='X', cat='user_annotation', name=f'stage:{name}', ts=ts, dur=dur, tid=1)


def _gpu(ts, dur, cat='kernel', stream=7):
    return dict(ph='X', cat=cat, name='k', ts=ts, dur=dur, tid=stream)


def test_busy_share_counts_every_stream_and_copies_once(tmp_path):
    # two 100 us steps; the second's 'loss' stage holds the longest gap
    events = [_range('step', 0, 100), _range('step', 100, 100), _range('loss', 120, 60),
              _gpu(0, 50), _gpu(20, 50, stream=13), _gpu(70, 10, cat='gpu_memcpy'),
              _gpu(100, 20), _gpu(180, 20, cat='gpu_memset'),
              dict(ph='X', cat='gpu_user_annotation', name='stage:loss', ts=120, dur=60,
                   tid=7)]  # an annotation on the GPU row: not work
    path = tmp_path / 'trace.json.gz'
    with gzip.open(path, 'wt') as f:
        json.dump(dict(traceEvents=events), f)
    fig = trace_busy(load_trace(str(path)))
    assert fig['steps'] == 2 and fig['wall_ms_per_step'] == pytest.approx(0.1)
    assert fig['gpu_busy_share'] == pytest.approx(120 / 200)  # 0-80, 100-120, 180-200
    assert fig['idle_ms_per_step']['loss'] == pytest.approx(60 / 1e3 / 2)
    assert fig['idle_ms_per_step']['(step, unlabelled)'] == pytest.approx(20 / 1e3 / 2)
    assert fig['longest_gaps'][0] == dict(ms=pytest.approx(0.06), at_ms=pytest.approx(0.12),
                                          stage='loss', gc_ms=0.0)


def test_a_gap_says_how_much_of_it_a_marked_garbage_collection_took(tmp_path):
    from mmdet3d_scaling.diagnostics.trace_busy import save_trace, trimmed
    gc_range = dict(ph='X', cat='user_annotation', name='gc:gen2', ts=130, dur=40, tid=3)
    events = [_range('step', 0, 200), _range('loss', 100, 100), _gpu(0, 120),
              _gpu(180, 20), gc_range]
    fig = trace_busy(events)
    assert fig['longest_gaps'][0] == dict(ms=pytest.approx(0.06), at_ms=pytest.approx(0.12),
                                          stage='loss', gc_ms=pytest.approx(0.04))
    save_trace(trimmed(events), str(tmp_path / 'trimmed.json.gz'))  # the mark is kept
    assert trace_busy(load_trace(str(tmp_path / 'trimmed.json.gz'))) == fig


def test_a_real_cpu_trace_has_its_steps_and_no_gpu_work(tmp_path):
    step = StepRange()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            step.open()
            torch.ones(256, 256).sum()
            step.close()
    write_trace(prof, str(tmp_path / 'cpu.json'))
    fig = trace_busy(load_trace(str(tmp_path / 'cpu.json')))
    assert fig['steps'] == 2 and fig['gpu_busy_share'] == 0.0


def test_a_trace_without_steps_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match='benchmark_train_step.py --trace'):
        trace_busy([_gpu(0, 10)])


def test_a_trimmed_trace_gives_the_same_figures(tmp_path):
    from mmdet3d_scaling.diagnostics.trace_busy import save_trace, trimmed
    events = [_range('step', 0, 100), _range('loss', 20, 30), _gpu(0, 40), _gpu(60, 30),
              dict(ph='X', cat='cpu_op', name='aten::mm', ts=5, dur=10, tid=1),
              dict(ph='f', cat='ac2g', name='flow', ts=5, id=3)]
    save_trace(trimmed(events), str(tmp_path / 'small.json.gz'))
    small = load_trace(str(tmp_path / 'small.json.gz'))
    assert len(small) == 4 and trace_busy(small) == trace_busy(events)
