"""Checks shared by the config steps: one wording for one kind of mistake."""
from typing import Any, Iterable, Tuple


class ConfigConflictError(ValueError):
    """Two config entries set the same thing to different values."""


def positive_int(where: str, value: Any) -> int:
    """``value`` if it is an int >= 1 (bools refused), else a ValueError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{where} must be a positive integer, got {value!r}')
    return value


def positive_number(where: str, value: Any) -> float:
    """``value`` if it is an int or float > 0 (bools refused), else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f'{where} must be a positive number, got {value!r}')
    return value


def canonical(value: Any) -> Any:
    """A comparable form: dicts regardless of key order, gradient clip type 'norm' explicit."""
    if isinstance(value, dict):
        value = dict(value)
        if 'max_norm' in value:
            value.setdefault('type', 'norm')
        return tuple(sorted((k, canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(canonical(v) for v in value)
    return value


def merge(what: str, sources: Iterable[Tuple[str, Any]]) -> Any:
    """The one value that several config places agree on (``None`` = not set there).

    Raises:
        ConfigConflictError: naming every place and value when set values differ.
    """
    given = [(place, value) for place, value in sources if value is not None]
    if len({repr(canonical(v)) for _, v in given}) > 1:
        listed = '; '.join(f'{place} = {value!r}' for place, value in given)
        raise ConfigConflictError(f'conflicting {what}: {listed}. Set it in one place '
                                  '(or make the values equal).')
    return given[0][1] if given else None
