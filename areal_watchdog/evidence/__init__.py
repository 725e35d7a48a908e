"""Sidecar, stage 'evidence': the plain evidence model and how it is gathered (discovery, stacks,
Flight Recorder, GPUs).
"""
