"""Running a job: the ScalingRunner, its hand-off from ``Runner.from_cfg``, the command
lines of ``tools/train.py`` / ``tools/test.py``, the work-dir lock, and the owners of
mmengine's private runner and optimizer-wrapper state (``optim_state``).

``runner`` and ``cli`` are imported by the package itself after ``config``.
"""
