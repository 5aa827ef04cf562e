"""The edges that touch the world for the engine: the aiohttp transport, SQLite files,
the terminal.

Rule of this package: each module wraps one library behind a seam the engine owns, and
imports nothing of the package but the pure core (``tests/test_layers.py`` enforces it).
"""
