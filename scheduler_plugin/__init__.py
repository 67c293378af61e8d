"""Placeholder so lint runs on the deviceplugin branch (the real one is on its own branch)."""
