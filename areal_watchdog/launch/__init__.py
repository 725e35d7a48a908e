"""Launcher, stage 'launch': build a plain LaunchPlan per backend, print it (--dry-run) or execute
it.
"""
