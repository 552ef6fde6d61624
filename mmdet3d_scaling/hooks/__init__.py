"""hooks of mmdet3d_scaling (one hook a file; the batch size search's hooks live in its
package, mmdet3d_scaling/batch_size; tooling hooks: diagnostics/hooks)."""
from .gpu_monitor_hook import GPUMonitorHook  # noqa: F401
from .accumulation_checkpoint_hook import AccumulationCheckpointHook  # noqa: F401
from .gradient_cumulative_optimizer_hook import GradientCumulativeOptimizerHook  # noqa: F401,E501
from .optimizer_step_param_scheduler_hook import OptimizerStepParamSchedulerHook  # noqa: F401,E501
from .scaling_plan_hook import ScalingPlanHook  # noqa: F401
from .garbage_collection_hook import GarbageCollectionHook  # noqa: F401
from .non_finite_guard_hook import NonFiniteGuardHook  # noqa: F401
from .preemption_hook import PreemptionHook  # noqa: F401
from .hang_doctor_hook import HangDoctorHook  # noqa: F401
from .async_runtime_info_hook import AsyncRuntimeInfoHook  # noqa: F401
