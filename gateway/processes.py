"""Several gateway processes on one port (`processes` > 1): the parent binds the socket as uvicorn
would, forks the processes, which each accept on it and run a whole gateway (their own Redis
connections and stream reader), and passes a stop signal on to them.

A gateway process relays on one core at most (Python's event loop); processes scale a host's
gateway to its cores, with no state shared between them beyond the socket, as separate gateways
behind a load balancer would share nothing either.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import secrets
import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

from shared.config import GatewaySettings

log = logging.getLogger(__name__)

ServeOne = Callable[[GatewaySettings, socket.socket], None]
"""Runs one gateway process on an open listening socket."""


def serve_processes(settings: GatewaySettings, serve_one: ServeOne) -> int:
    """Run `settings.processes` gateway processes on `settings.host`:`settings.port`, until they
    end; answers the exit status (the first non-zero of theirs, else 0)."""
    listening = uvicorn.Config("gateway.app:create_app", host=settings.host, port=settings.port).bind_socket()
    # fork: the settings and the socket carry over as they are, and the parent has started nothing
    # (no event loop, no thread, no connection) that a child could inherit half-way.
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(target=serve_one, args=(each, listening), name=f"gateway-{number}")
        for number, each in enumerate(each_process_settings(settings))
    ]
    for process in processes:
        process.start()
    listening.close()  # the processes hold it

    stopped_by: set[int] = set()

    def pass_on(signum: int, frame: FrameType | None) -> None:
        stopped_by.add(signum)
        for process in processes:
            if process.exitcode is None and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):  # it has just ended
                    os.kill(process.pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, pass_on)
    log.info("%d gateway processes on %s:%d", len(processes), settings.host, settings.port)
    for process in processes:
        process.join()
    # uvicorn ends a process it stopped gracefully by raising the signal again: that is a clean end.
    clean = {0, *(-signum for signum in stopped_by)}
    return next((code for process in processes if (code := process.exitcode or 0) not in clean), 0)


def each_process_settings(settings: GatewaySettings) -> list[GatewaySettings]:
    """The settings of each process: their notice partitions one after the other, from the setting's or
    from one drawn at random, so that no two processes of the host hear of each other's jobs (with as
    many partitions as processes at least)."""
    first = settings.gateway_notice_partition
    if first is None:
        first = secrets.randbelow(settings.notice_partitions)
    return [
        settings.model_copy(update={"gateway_notice_partition": first + number})
        for number in range(settings.processes)
    ]
