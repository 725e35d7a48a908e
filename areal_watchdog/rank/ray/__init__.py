"""A watched job's processes on Ray: AReaL's training script as the single controller of a Ray job
(``ray_controller``) and a Ray worker process that may become one of AReaL's workers
(``ray_worker``)."""
