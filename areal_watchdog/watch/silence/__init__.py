"""Looking at a silence, from the trigger to the posted incident: when the leader looks
(``triggers``, pure), the incident desk that gathers, classifies, writes and notifies
(``incident_desk``), how a silence escalates to ``on_hang`` (``escalation``), the warnings of a
silence that moves without working (``busy_warnings``), and the records a silence is followed with
(``stall_case``). What counts as movement is judged in ``diagnose``."""
