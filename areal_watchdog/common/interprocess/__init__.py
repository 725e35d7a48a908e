"""How our processes reach each other and the job's servers: one line to a listener's FIFO
(``fifo``), waiting for a file another process writes (``backoff``), a signal when the parent dies
(``parent``), a free TCP port (``ports``), HTTP straight to the job's inference servers (``http``).
A new helper for talking to another process belongs here."""
