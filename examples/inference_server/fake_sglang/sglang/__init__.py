"""Not SGLang: the names AReaL's server launcher imports, backed by our CPU stand-in.

AReaL starts an inference server as ``python3 -m
areal.experimental.inference_service.sglang.launch_server ARGS`` and checks that the installed
``sglang`` is at least 0.5.10.post1. With this folder on ``PYTHONPATH`` (its dist-info answers
the version check), that module's ``prepare_server_args`` runs
``examples/inference_server/sglang_standin.py`` with the host, port and model AReaL chose, so
AReaL's own code launches, waits for and talks to a real HTTP server. No AReaL file is changed.
"""

__version__ = "0.5.10.post1"
