"""A submitted Slurm job followed and ended by id: its state, waiting, cancelling and node statuses
(``jobs``), a handle for ``status`` and ``cancel`` (``handle``), and the allocation kept for a
resume (``same_allocation``). Every job id reaches ``scontrol``/``scancel`` through here."""
