"""What the kernel says of a process without stopping it or attaching to it (``/proc`` through
``psutil``, ``ss``): its counters (``counters``), its bytes over TCP (``sockets``), its writes to
its own logs (``log_writes``), what it is blocked on (``kernel_wait``), and what a look knows of its
movement (``process_movement``, which ``evidence.model`` carries). A new per-process reading the
sidecar takes between or at looks belongs here; what needs a stack (py-spy: ``evidence.pyspy``,
``evidence.process_tree``) does not."""
