"""What one process is doing, read from its own evidence alone: the call it waits in and its kind
(``activity``), whose code each stack frame is (``frames``), the child a blocked rank waits on
(``children``), the one line its stderr repeats (``log_flood``). Pure. A new reading of one
process's stacks, kernel wait or log tail belongs here; a rule that compares processes belongs in
``patterns`` or ``rollout_rules``."""
