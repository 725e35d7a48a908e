"""Sidecar, stage 'watch': the loop, pure trigger decisions, incidents, coordination between nodes,
progress.
"""
