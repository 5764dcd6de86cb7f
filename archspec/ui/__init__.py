"""`archspec ui`: the registry in a browser, read-only (archspec.ui.app; the `ui` extra)."""
