"""The one way a shim swaps a method of an upstream class for its own."""
from typing import Any, Callable


def replace_method(owner: Any, name: str, replacement: Callable) -> bool:
    """Put ``replacement`` at ``owner.<name>``, keeping the method it replaces as
    ``replacement.original`` (for the shim's fallbacks and tests). Idempotent: once in
    place, a second call changes nothing and the original stays the original."""
    current = getattr(owner, name)
    if current is not replacement:
        replacement.original = current
        setattr(owner, name, replacement)
    return True
