"""The one torchrun command line every launch uses: local, each Slurm node, and replay.

Each rank's stdout and stderr go to files under the run directory, and local rank 0's also to
the terminal, so the user sees their job as without us.
"""

from __future__ import annotations

from areal_watchdog.rundir.layout import RunLayout


def torchrun_command(
    python: str,
    layout: RunLayout,
    node: str,
    nproc_per_node: int,
    rendezvous: list[str],
    rank_command: list[str],
) -> list[str]:
    """``python -m torch.distributed.run RENDEZVOUS --nproc-per-node N ... RANK_COMMAND``."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        *rendezvous,
        "--nproc-per-node",
        str(nproc_per_node),
        "--log-dir",
        str(layout.torchrun_logs_dir / node),
        "--redirects",
        "3",
        "--tee",
        "3",
        "--local-ranks-filter",
        "0",
        *rank_command,
    ]


def standalone() -> list[str]:
    """One node, a rendezvous on a free local port. PyTorch's TCPStore listens on every
    interface whatever the endpoint's host (measured on torch 2.13: ``:::PORT``), so no flag
    confines it to loopback (docs/security.md)."""
    return ["--standalone", "--nnodes", "1"]


def multi_node(n_nodes: int, node_rank: str, master_addr: str, master_port: str) -> list[str]:
    """Several nodes rendezvous on the first node's address."""
    return [
        "--nnodes",
        str(n_nodes),
        "--node-rank",
        node_rank,
        "--master-addr",
        master_addr,
        "--master-port",
        master_port,
    ]
