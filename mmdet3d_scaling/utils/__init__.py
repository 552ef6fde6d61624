"""Small helpers every layer may use; they import nothing else from the package."""
