"""The parity benchmark's error and its argument check."""
from typing import Any


class ParityError(ValueError):
    """A combination of arrangement settings that cannot be trained as asked."""


def positive(name: str, value: Any) -> int:
    """``value`` if it is an int >= 1 (not a bool), else a ParityError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ParityError(f'{name} must be a positive integer, got {value!r}')
    return value
