"""Tool sources: native functions (:func:`define_tool`), HTTP tools and the built-ins, as
sources a toolkit composes (``_sources``); and the public ``Toolkit``, the engine's registry
plus the standard assembly ``Toolkit.create`` (``_standard``)."""
