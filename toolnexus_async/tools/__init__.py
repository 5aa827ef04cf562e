"""Tool sources: native functions (:func:`define_tool`) and the built-ins."""
