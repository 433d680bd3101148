"""temper's pipeline core: recipe schema, steps, runner, cache and CLI."""
