"""Processes that block in functions named like torch.distributed's operations but are not:
``python name_alikes.py CASE``, where CASE is one of ``CASES``. Each prints ``ready`` just before
it blocks, and blocks until killed; every socket is on 127.0.0.1.

- ``requests``: ``requests.post`` to a server that accepts and never answers (the stack holds
  ``HTTPAdapter.send``, as an AReaL actor's callback thread does in a lost weight update);
- ``zmq``: a REQ socket's ``send`` to a peer that never binds (ZMQ_IMMEDIATE: the send waits for
  a connection), and in a second thread ``recv_multipart`` on a REP socket nobody writes to
  (pyzmq's ``recv`` itself is compiled: no frame of its own);
- ``asyncio``: ``loop.sock_sendall`` on a socket whose peer never reads (the buffers fill) and,
  in a second thread's loop, ``sock_recv`` on one whose peer never writes. The sockets are left
  blocking, so each coroutine blocks inside its own frame; a suspended coroutine would be on no
  thread's stack at all (its loop shows ``select``);
- ``user``: the user's own ``broadcast`` and ``barrier`` (a threading.Barrier nobody else reaches).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading

CASES = ("requests", "zmq", "asyncio", "user")


def ready() -> None:
    print("ready", flush=True)


def listener() -> socket.socket:
    """A loopback socket that accepts connections (the kernel's backlog) and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server


def block_in_requests() -> None:
    import requests

    server = listener()
    port = server.getsockname()[1]
    ready()
    requests.post(f"http://127.0.0.1:{port}/callback/update_weights_disk", json={}, timeout=None)


def block_in_zmq() -> None:
    import zmq

    context = zmq.Context()
    rep = context.socket(zmq.REP)
    rep.bind("tcp://127.0.0.1:*")
    threading.Thread(target=rep.recv_multipart, name="zmq-recv", daemon=True).start()
    with socket.socket() as probe:  # a port nobody listens on: the REQ never connects
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    req = context.socket(zmq.REQ)
    req.setsockopt(zmq.IMMEDIATE, 1)
    req.connect(f"tcp://127.0.0.1:{port}")
    ready()
    req.send(b"weights")


async def _send_all(sock: socket.socket) -> None:
    await asyncio.get_running_loop().sock_sendall(sock, b"x" * (64 << 20))


async def _receive(sock: socket.socket) -> None:
    await asyncio.get_running_loop().sock_recv(sock, 1)


def block_in_asyncio() -> None:
    server = listener()
    sender, receiver = (socket.create_connection(server.getsockname()) for _ in range(2))
    recv = threading.Thread(target=asyncio.run, args=(_receive(receiver),), name="sock-recv")
    recv.daemon = True
    recv.start()
    ready()
    asyncio.run(_send_all(sender))


def broadcast(gate: threading.Barrier) -> None:
    """The user's own broadcast: waits at a barrier of its own that nobody else reaches."""
    barrier(gate)


def barrier(gate: threading.Barrier) -> None:
    gate.wait()


def block_in_user_code() -> None:
    ready()
    broadcast(threading.Barrier(2))


def main(case: str) -> None:
    blockers = {
        "requests": block_in_requests,
        "zmq": block_in_zmq,
        "asyncio": block_in_asyncio,
        "user": block_in_user_code,
    }
    blockers[case]()


if __name__ == "__main__":
    main(sys.argv[1])
