"""AReaL's ``rpc_server`` shape: the MainThread serves HTTP (``serve_forever`` on 127.0.0.1) while
every collective runs in a worker thread named ``EngineWorker`` (gloo, CPU). Scenarios
(``scenario.name``):

mismatch   at step S, rank R's EngineWorker calls broadcast where the others call all_reduce
straggler  at step S, rank R's EngineWorker computes forever (a busy loop) while the others wait
           in the next all_reduce
none       a healthy run

The watchdog must judge the EngineWorker thread, not the MainThread idling in ``serve_forever``.
"""

from __future__ import annotations

import argparse
import datetime
import http.server
import threading
import time
import traceback

import torch
import torch.distributed as dist
import yaml


class Health(http.server.BaseHTTPRequestHandler):
    """``GET /health`` -> 200: the worker's control plane (AReaL's /health, /set_env, ...)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def step_line(step: int, total: int) -> str:
    now = datetime.datetime.now().strftime("%Y%m%d-%H:%M:%S.%f")[:-3]
    return (
        f"(AReaL) {now} StatsLogger INFO: Epoch 1/1 Step {step}/{total} "
        f"Train step {step}/{total} done."
    )


def engine_worker(scenario: dict, server: http.server.HTTPServer, failed: list[str]) -> None:
    """All distributed work, as in AReaL's EngineWorker thread; stops the server at the end."""
    try:
        train(scenario)
    except BaseException:  # noqa: BLE001 - report it from the main thread
        failed.append(traceback.format_exc())
    finally:
        server.shutdown()


def train(scenario: dict) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    culprit = rank == scenario["rank"]
    grads, loss = torch.ones(8), torch.ones(1)
    for step in range(1, scenario["steps"] + 1):
        time.sleep(scenario["step_time"])
        dist.all_reduce(grads)
        if step == scenario["step"] and culprit:
            if scenario["name"] == "mismatch":
                dist.broadcast(loss, src=0)
            elif scenario["name"] == "straggler":
                compute_forever()
        dist.all_reduce(loss)
        if rank == 0:
            print(step_line(step, scenario["steps"]), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def compute_forever() -> None:
    value = 0
    while True:
        value += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    with open(parser.parse_args().config) as fh:
        config = yaml.safe_load(fh)
    scenario = {"name": "mismatch", "rank": 2, "step": 3, "steps": 6, "step_time": 0.1}
    scenario.update(config.get("scenario") or {})
    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    failed: list[str] = []
    worker = threading.Thread(
        target=engine_worker, args=(scenario, server, failed), name="EngineWorker", daemon=True
    )
    worker.start()
    server.serve_forever(poll_interval=0.5)
    worker.join()
    if failed:
        raise SystemExit(failed[0])


if __name__ == "__main__":
    main()
