"""The Flight Recorder's collective record read as a whole: which collective each rank is on, per
process group (``collectives``), and the verdict the dumps support when no stacks came with them
(``dumps_only``, ``areal-launch diagnose DIR``). Pure. What is judged from the traces alone belongs
here; the traces are captured in ``evidence.listeners``."""
