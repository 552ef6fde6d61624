"""NVML figures of one CUDA device: utilisation, device memory, power, temperature.

NVML (``nvidia-ml-py``, imported as ``pynvml``) sees every GPU of the machine and the
driver's view of it (other processes included), which torch's allocator does not.
"""
import logging
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from mmengine.logging import print_log

MB = 1024 * 1024
#: NVML's value types (nvmlValueType_t) -> the field of ``nvmlValue_t`` that holds it
_VALUE_FIELDS = {0: 'dVal', 1: 'uiVal', 2: 'ulVal', 3: 'ullVal', 4: 'sllVal'}


def mean_new_samples(value_type: int, samples: Iterable[Any],
                     since_us: int) -> Tuple[Optional[float], int]:
    """Mean of the NVML samples newer than ``since_us`` and the newest time stamp.

    Args:
        value_type: the ``nvmlValueType_t`` ``nvmlDeviceGetSamples`` returned.
        samples: its ``nvmlSample_t`` records (``timeStamp`` in µs, ``sampleValue``).
        since_us: the newest time stamp already used.

    Returns:
        (mean, newest time stamp); (None, ``since_us``) when no sample is newer.
    """
    new = [s for s in samples if s.timeStamp > since_us]
    if not new:
        return None, since_us
    field = _VALUE_FIELDS.get(value_type, 'uiVal')
    mean = sum(float(getattr(s.sampleValue, field)) for s in new) / len(new)
    return mean, max(s.timeStamp for s in new)


class NvmlSampler:
    """NVML queries for one CUDA device; a field the device refuses is dropped, once,
    with a log line.

    Args:
        pynvml: the imported ``pynvml`` module (``nvidia-ml-py``).
        device_index: torch's index of the device (counts only visible devices).
    """

    def __init__(self, pynvml: Any, device_index: int) -> None:
        self._nvml = pynvml
        pynvml.nvmlInit()
        self.handle = self._handle_for(device_index)
        self._last_sample_us = 0
        self.dropped: List[str] = []
        try:  # skip the samples from before training (start-up, other jobs)
            self._utilisation()
        except pynvml.NVMLError:
            pass

    def _handle_for(self, device_index: int) -> Any:
        # torch's index counts only CUDA_VISIBLE_DEVICES; NVML counts every GPU. The
        # UUID names the same card in both.
        uuid = getattr(torch.cuda.get_device_properties(device_index), 'uuid', None)
        if uuid is not None:
            try:
                return self._nvml.nvmlDeviceGetHandleByUUID(f'GPU-{uuid}')
            except self._nvml.NVMLError:
                pass
        return self._nvml.nvmlDeviceGetHandleByIndex(device_index)

    def _utilisation(self) -> float:
        """Mean GPU utilisation (%) of the driver's samples since the last call.

        Falls back to the instantaneous figure when the driver has no new samples.
        """
        nvml = self._nvml
        try:
            value_type, samples = nvml.nvmlDeviceGetSamples(
                self.handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, self._last_sample_us)
        except nvml.NVMLError:
            value_type, samples = 1, []
        mean, self._last_sample_us = mean_new_samples(value_type, samples,
                                                      self._last_sample_us)
        if mean is None:
            return float(nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        return mean

    def read(self) -> Dict[str, float]:
        """``util_pct``, ``nvml_mem_used_mb`` (MiB), ``power_w``, ``temp_c`` (°C), less
        the fields this device refused."""
        nvml = self._nvml
        queries = {
            'util_pct': self._utilisation,
            'nvml_mem_used_mb': lambda: nvml.nvmlDeviceGetMemoryInfo(self.handle).used / MB,
            'power_w': lambda: nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0,
            'temp_c': lambda: float(
                nvml.nvmlDeviceGetTemperature(self.handle, nvml.NVML_TEMPERATURE_GPU)),
        }
        values = {}
        for key, query in queries.items():
            if key in self.dropped:
                continue
            try:
                values[key] = float(query())
            except nvml.NVMLError as err:
                self.dropped.append(key)
                print_log(f'GPUMonitorHook: NVML cannot report {key} on this device '
                          f'({err}); it is left out from now on.', logger='current')
        return values

    def close(self) -> None:
        """Shut NVML down (one ``nvmlShutdown`` per ``nvmlInit``)."""
        self._nvml.nvmlShutdown()


def open_nvml(device: torch.device) -> Optional[NvmlSampler]:
    """An :class:`NvmlSampler` for ``device``, or None with a warning that says why
    (``nvidia-ml-py`` missing, NVML not usable on this machine)."""
    try:
        import pynvml
    except ImportError:
        print_log('GPUMonitorHook: nvml=True but nvidia-ml-py is not installed '
                  '(`pip install nvidia-ml-py`); utilisation, power and temperature '
                  'are left out. Set nvml=False to silence this.', logger='current',
                  level=logging.WARNING)
        return None
    try:
        return NvmlSampler(pynvml, device.index)
    except pynvml.NVMLError as err:
        print_log(f'GPUMonitorHook: NVML is not usable here ({err}); utilisation, '
                  'power and temperature are left out.', logger='current',
                  level=logging.WARNING)
        return None
