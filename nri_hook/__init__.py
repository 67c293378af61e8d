"""Placeholder so lint runs on the deviceplugin branch (the nri_hook branch has the real one)."""
