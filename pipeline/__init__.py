"""temper's pipeline core: recipe schema, steps, runner, cache and CLI."""

__version__ = "0.1.0"
