"""What ``on_hang: resume`` does after a hang, in the order docs/recovery.md tells it: the checks
at launch (``checks``), the replay of the hung step on one node (``replay_decides``), the
bisection of its batch (``bisect``), the decision (``policy``), the relaunch (``resume``) and
what the sinks hear (``notices``). It runs in the launcher, above the backends it asks; the
replay's config is planned from the dumps in ``trajectory.replay.replay_plan``, which the ``replay``
command shares, and the rows left out are ``trajectory.quarantine``'s."""
