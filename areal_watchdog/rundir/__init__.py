"""The run directory: the contract between the launcher, the sidecars and the ranks (where each
file lives, what the launcher tells the sidecars).
"""
