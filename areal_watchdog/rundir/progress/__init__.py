"""The job's progress as the run directory carries it: the ranks' heartbeats and announced pauses
(``heartbeat``, the public progress API), heartbeats as file names (``beats``), the leader's pace in
its node status (``pace``) and the bounded history a timeline is drawn from (``history``). A new
record of steps and pace belongs here."""
