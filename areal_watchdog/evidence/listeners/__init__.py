"""The sidecar's side of the listeners every watched rank runs (``rank/``): a line written to the
rank's FIFO, its answer read back from a file. Stacks from the rank's own ``faulthandler``
(``faulthandler``), its Flight Recorder traces (``flight_recorder``), its collectives in flight
between looks (``collectives_in_flight``), its pending asyncio tasks (``tasks``). A new question
asked of the ranks' listeners belongs here."""
