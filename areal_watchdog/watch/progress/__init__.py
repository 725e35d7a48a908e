"""Following the job's progress: the step lines in its logs (``step_log``), the ranks' heartbeats
and announced pauses (``heartbeats``), and the clock that turns them into a stall decision, with a
threshold fixed or learned from the job's own steps (``stall_clock``). Reads files, decides nothing
else. A new source of progress belongs here."""
