"""The sidecar's parts, each handed what it uses: the collaborators and the job's view they share
(``shared``), the sidecar's voice (``voice``), following progress (``progress_watch``), the node
status it publishes (``status_publisher``), the job's end (``job_end``), the leader's poll
(``leader``), the metrics it feeds (``metrics_feed``) and the launcher's heartbeat on a Ray node
(``launcher_heartbeat``). ``watch.sidecar`` wires them and runs the loop."""
