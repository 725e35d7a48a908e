"""What runs on every rank of a HangBench case: the case's own program, with the few lines each
peer asks its users to add, added here once so that no case program knows about any tool.

- PyTorch's collective timeout, set to the benchmark's limit (``HANGBENCH_COLLECTIVE_TIMEOUT``):
  ``init_process_group(timeout=...)``, as a user sets it.
- The Flight Recorder on, and NCCL's ``TORCH_NCCL_DUMP_ON_TIMEOUT`` emulated for gloo (which
  has none): a rank dumps its record (``<HANGBENCH_FR_DIR>/rank_<r>``, the pickle
  ``torchfrtrace`` reads) when a collective raises and when torchrun ends it.
- Under ``ft_launcher``, nvidia-resiliency-ext's calls as its integration guides place them
  (``HANGBENCH_FT_API``), once the process group is up (as its examples start them): a heartbeat
  after each optimizer step and each evaluation forward pass (its example beats in its
  validation loop too), or the sections ``init`` (the process group's start to the first
  forward pass) and ``step`` (a training step's forward pass to its optimizer step; an
  evaluation forward pass), and the timeouts learned (``calculate_and_set_hb_timeouts``, or
  ``calculate_and_set_section_timeouts(['step'])`` as its example does after an epoch) after
  step ``HANGBENCH_FT_LEARN_AT``, the end of the job's first full cycle of phases.
- A timestamped line when a collective raises (``HANGBENCH torch_error``): the moment the
  timeout fired, for the scorecard.

Run as the entrypoint, with ``HANGBENCH_PROGRAM`` naming the case's program and its arguments
passed through.
"""

from __future__ import annotations

import datetime
import functools
import os
import runpy
import signal
import sys
import time

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main() -> None:
    say("started", "")  # a hang before the first step counts from here
    program = os.environ["HANGBENCH_PROGRAM"]
    limit = os.environ.get("HANGBENCH_COLLECTIVE_TIMEOUT")
    if limit:
        set_collective_timeout(float(limit))
    if os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
        learn_at = int(os.environ["HANGBENCH_FT_LEARN_AT"])
        FaultToleranceCalls(os.environ["HANGBENCH_FT_API"], learn_at)
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, functools.partial(_dump_and_exit, before))
    sys.argv = [program, *sys.argv[1:]]
    sys.path.insert(0, os.path.dirname(program))
    try:
        runpy.run_path(program, run_name="__main__")
    except Exception as error:
        say("torch_error", f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
        dump_flight_record()
        mark_failed()
        raise


def set_collective_timeout(seconds: float) -> None:
    """Every process group the program makes gets the benchmark's limit as its timeout: the
    default group and each ``new_group`` (which does not inherit it)."""
    for name in ("init_process_group", "new_group"):
        original = getattr(dist, name)

        def with_timeout(*args: object, _original=original, **kwargs: object) -> object:  # noqa: ANN001
            kwargs["timeout"] = datetime.timedelta(seconds=seconds)
            return _original(*args, **kwargs)

        setattr(dist, name, functools.wraps(original)(with_timeout))


class FaultToleranceCalls:
    """nvidia-resiliency-ext's documented calls, hooked onto what every training loop does
    (forward passes, optimizer steps), in this process only (not in forked DataLoader workers)."""

    def __init__(self, api: str, learn_at: int) -> None:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
        from torch.nn.modules import module
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.api, self.learn_at, self.pid = api, learn_at, os.getpid()
        self.client = RankMonitorClient()
        self.steps, self.depth, self.open = 0, 0, ""
        joined = dist.init_process_group

        def join_then_watch(*args: object, **kwargs: object) -> object:
            """As its examples do: the process group first, then the client and ``init``."""
            group = joined(*args, **kwargs)
            self.client.init_workload_monitoring()
            if api == "sections":
                self._section("init")
            return group

        dist.init_process_group = functools.wraps(joined)(join_then_watch)
        module.register_module_forward_pre_hook(self._forward_begins)
        module.register_module_forward_hook(self._forward_ends)
        register_optimizer_step_post_hook(self._stepped)

    def _section(self, name: str) -> None:
        if self.open:
            self.client.end_section(self.open)
        if name:
            self.client.start_section(name)
        self.open = name

    def _forward_begins(self, *_: object) -> None:
        if os.getpid() == self.pid and self.client.is_initialized:
            self.depth += 1
            if self.depth == 1 and self.api == "sections" and self.open != "step":
                self._section("step")

    def _forward_ends(self, *_: object) -> None:
        if os.getpid() != self.pid or not self.client.is_initialized:
            return
        self.depth -= 1
        if self.depth == 0 and not torch.is_grad_enabled():  # an evaluation step
            if self.api == "heartbeats":
                self.client.send_heartbeat()
            else:
                self._section("")

    def _stepped(self, *_: object) -> None:
        if not self.client.is_initialized:
            return
        if self.api == "heartbeats":
            self.client.send_heartbeat()
        else:
            self._section("")
        self.steps += 1
        if self.steps == self.learn_at:
            if self.api == "heartbeats":
                self.client.calculate_and_set_hb_timeouts(skip_if_not_ready=True)
                say("ft_learned", str(self.client.hb_timeouts))
            else:
                self.client.calculate_and_set_section_timeouts(["step"], calc_out_of_section=False)
                say("ft_learned", str(self.client.section_timeouts))


def dump_flight_record() -> None:
    """This rank's Flight Recorder, where ``torchfrtrace`` reads it; once."""
    folder = os.environ.get("HANGBENCH_FR_DIR")
    if not folder or not dist.is_initialized():
        return
    path = os.path.join(folder, f"rank_{dist.get_rank()}")
    if os.path.exists(path):
        return
    os.makedirs(folder, exist_ok=True)
    data = torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=False)
    with open(path + ".tmp", "wb") as fh:
        fh.write(data)
    os.replace(path + ".tmp", path)


def mark_failed() -> None:
    """A file per rank that raised, for the ft_launcher shim (``ft_python``): ft_launcher 0.4.1
    exits 0 when its agent ends UNHEALTHY rather than FAILED, torchrun exits 1."""
    folder = os.environ.get("HANGBENCH_FAILED_DIR")
    if folder:
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, f"rank_{os.environ.get('RANK', '?')}"), "w").close()


def _dump_and_exit(before: object, signum: int, frame: object) -> None:
    """torchrun ends the rank: its record first, then whatever handled SIGTERM before."""
    dump_flight_record()
    if callable(before):
        before(signum, frame)
    sys.exit(128 + signum)


def say(event: str, text: str) -> None:
    """One line the runner reads: ``HANGBENCH <event> rank=<r> at=<unix time> <text>``."""
    rank = os.environ.get("RANK", "?")
    print(f"HANGBENCH {event} rank={rank} at={time.time():.3f} {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
