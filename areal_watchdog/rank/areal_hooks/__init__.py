"""Hooks into AReaL's classes inside a rank, with no edit of the training script: run code right
after one of AReaL's modules is imported (``after_import``), dump and replay each step's rollout
batch (``areal_trajectory``), and leave quarantined rows out of a resumed run
(``areal_quarantine``)."""
