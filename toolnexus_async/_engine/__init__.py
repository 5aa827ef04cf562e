"""The run engine: the shell that performs what the pure core decides.

Rule of this package: it sits on ``_core`` and ``_io`` and never imports the fronts above
it (``durable``, ``serve``, the CLI); ``Engine.drive(RunSpec)`` is the one door through
which every run is driven (``tests/test_layers.py`` enforces the imports).
"""
