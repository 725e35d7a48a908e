"""The rollout side's hangs: the trainer waits for rollouts, or for a weight transfer to the
inference servers (``rollout``, ``weight_sync``), the evidence both read (``rollout_evidence``), a
call one server keeps waiting (``server_calls``) and the exception a failing workflow repeats
(``exceptions``). Pure. A rule about inference servers, rollout workers or their tasks belongs here.
"""
