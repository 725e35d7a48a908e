"""Real stand-ins and helpers that both the tests and the benchmarks use: loopback servers (the
webhook receiver, the vendors, the slow upload endpoint, a real vLLM), a FUSE storage that stops
answering, ``areal-launch`` run for real, and what its runs leave read back.

A module only the tests use stays in ``tests/``; one only the benchmarks use stays in
``benchmarks/``. Never shipped in the wheel (``[tool.setuptools.packages.find]``)."""
