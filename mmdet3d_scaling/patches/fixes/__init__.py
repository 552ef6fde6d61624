"""The ``fixes`` patch set: one declared patch a module (see ../patching.py)."""
