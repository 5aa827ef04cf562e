"""The front-end protocols of serve's runs, sans-IO: AG-UI (:mod:`.agui`) and the AI SDK's
UI message stream (:mod:`.aisdk`).

Rule of this package: pure code. A protocol takes a request's body and the run as the
store has it (:class:`~.runs.RunSnapshot`) and gives decisions (start a run, hand these
answers over) and events; it never reads a socket or a store (the clock only when it is
not given ``now``).
The adapters that do (serve's aiohttp routes, the ASGI application) are
``toolnexus_async.serve``'s, and docs/ui-protocols.md describes what clients see.
"""
