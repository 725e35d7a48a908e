"""Files a sidecar writes into the run directory for others to read: the request to end a hung job
(``hang_request``), the incidents the launcher reads back (``incidents``), what was left to finish
after the job ended (``late_finish``), where it serves its metrics (``metrics_endpoint``) and every
node's last status (``node_status``). A new file a sidecar publishes belongs here; its name belongs
in ``rundir.layout``."""
