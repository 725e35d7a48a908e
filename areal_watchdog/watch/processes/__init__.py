"""This node's processes as the sidecar watches them: which ranks and other processes live, which
ended, how busy they are and their evidence when asked (``node_watch``), whether its inference
servers generate (``server_pulse``), and the two cheap sensors read between looks: collectives in
flight (``in_flight_sensor``) and calls a server keeps waiting (``server_call_sensor``). A new
reading of this node's processes belongs here."""
