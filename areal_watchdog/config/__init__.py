"""Launcher, stage 'config': read an AReaL-style YAML with overrides and validate our sections."""
