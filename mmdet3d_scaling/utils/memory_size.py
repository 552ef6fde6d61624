"""Memory sizes as users write them in configs: a number of GiB or a string with a unit."""
import math
import re
from typing import Union

_UNITS = {'gib': 2**30, 'mib': 2**20, 'gb': 10**9, 'mb': 10**6}


def parse_memory_budget(value: Union[int, float, str],
                        where: str = 'scaling.memory_budget') -> int:
    """Bytes of a memory budget: a number of GiB (``24``, ``22.5``) or a string with a
    unit (``'24GiB'``, ``'24 GiB'``, ``'1536MiB'``, ``'24GB'`` = 24e9 bytes).

    Raises:
        ValueError: naming ``where`` and the value, for anything else (bools, zero or
            negative sizes, unknown units, NaN / infinity).
    """
    hint = (f"{where} is the GPU memory to fit training in: a number of GiB (e.g. 24) "
            "or a string with a unit, 'GiB', 'MiB', 'GB' or 'MB' (e.g. '24GiB')")
    if isinstance(value, bool):
        raise ValueError(f'{where}={value!r} is not a memory size. {hint}.')
    if isinstance(value, (int, float)):
        number, unit = float(value), 'gib'
    elif isinstance(value, str):
        match = re.fullmatch(r'\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]+)\s*',
                             value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f'{where}={value!r} is not a memory size. {hint}.')
        number, unit = float(match.group(1)), match.group(2).lower()
    else:
        raise ValueError(f'{where}={value!r} ({type(value).__name__}) is not a memory '
                         f'size. {hint}.')
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f'{where}={value!r} must be a positive, finite size. {hint}.')
    size = int(number * _UNITS[unit])
    if size < 2**20:
        raise ValueError(f'{where}={value!r} is {size} bytes, under 1 MiB: a number is '
                         f'read as GiB ({hint}).')
    return size
