"""The pure core: what a run is and what it decides, with no event loop and no I/O.

Rule of this package: its modules import only each other and the standard library's
non-I/O parts (no ``asyncio``, ``anyio``, ``aiohttp``, database or MCP library), so each
rule here is tested with plain calls (``tests/test_layers.py`` enforces it).
"""
