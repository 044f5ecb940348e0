"""Built-in checks: one module per check, each defining ``check = ...``."""
