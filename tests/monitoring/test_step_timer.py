"""StepTimer on a given clock (the figures are arithmetic on known times)."""
import pytest
import torch

from mmdet3d_scaling.monitoring.step_timer import StepTimer, batch_size_of


class Clock:
    """Returns the times it is given, in order."""

    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_wait_share_and_rate_of_a_window():
    # window from 0; iterations of 4 samples end at 1 and 3, the second starts at 2
    timer = StepTimer(Clock(0.0, 1.0, 2.0, 3.0))
    timer.count(4)
    timer.iter_ended()  # 1.0
    timer.iter_started()  # 2.0: 1 s of data wait
    timer.count(4)
    timer.iter_ended()  # 3.0
    assert timer.figures(4.0) == dict(data_wait_share=pytest.approx(0.25),
                                      samples_per_s=pytest.approx(2.0))


def test_validation_time_is_left_out():
    timer = StepTimer(Clock(0.0, 1.0, 3.0))
    timer.count(2)
    timer.pause()  # 1.0
    timer.resume()  # 3.0: 2 s of validation; the wait restarts from here
    assert timer.figures(4.0) == dict(data_wait_share=0.0, samples_per_s=1.0)


def test_unknown_batch_size_reports_no_rate_and_an_empty_window_nothing():
    timer = StepTimer(Clock(0.0))
    timer.count(None)
    assert timer.figures(2.0) == dict(data_wait_share=0.0)
    timer.restart(5.0)
    assert timer.iters == 0 and timer.figures(5.0) == {}


def test_first_iteration_has_no_wait():
    timer = StepTimer(Clock(0.0, 7.0))
    timer.iter_started()  # no iteration ended before
    assert timer.wait_s == 0.0


def test_batch_size_from_common_batch_layouts():
    assert batch_size_of(dict(inputs=torch.zeros(3, 4), targets=torch.zeros(3))) == 3
    assert batch_size_of(dict(inputs=dict(points=[torch.zeros(5, 4)] * 2),
                              data_samples=[object()] * 2)) == 2
    assert batch_size_of([torch.zeros(2)] * 5) == 5
    assert batch_size_of(torch.tensor(1.0)) is None
    assert batch_size_of(object()) is None
