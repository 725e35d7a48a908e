"""Helpers every process uses (launcher, sidecar, rank): atomic files, errors, rank lists,
redaction.
"""
