"""The processes of a federation on this machine: free ports, and stopping a process with everything below it.

Every process of a :class:`fedx.deploy.local.LocalFederation` starts in its
own process group, so stopping it also stops the SuperExec and app
processes it started. The federation tracks each process it starts as a
:class:`psutil.Process` (a pid that ends and is used again by someone else
is never signalled), gives each the federation's own marker in its
environment (:data:`FEDERATION_VARIABLE`, unique per federation), and when
it stops, stops those processes, everything below them, and any process
that still carries its marker (a ServerApp the SuperLink started just
before the stop, no longer below anything of ours): never a process
because it shares the federation's ``FLWR_HOME`` (a user's shell or
notebook that exported it).
"""

import contextlib
import os
import signal
import socket
import time

import psutil

#: The variable whose value marks every process of one federation (its own random value).
FEDERATION_VARIABLE = "FEDX_FEDERATION"
#: Seconds a stopped process has between SIGTERM and SIGKILL.
STOP_GRACE = 15.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float) -> None:
    """Wait until something accepts connections on ``host:port``.

    Raises
    ------
    TimeoutError
        When nothing does within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(1.0)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:g}s")


def running(process: psutil.Process) -> bool:
    """Whether ``process`` (the very one: not another with its pid) runs; a zombie has ended."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(process: psutil.Process, sig: int) -> None:
    """Send ``sig`` to ``process`` if it still is the process it was (psutil checks)."""
    with contextlib.suppress(psutil.Error):
        process.send_signal(sig)


def stop_processes(
    processes: list[psutil.Process], sig: int, *, groups: bool = False, grace: float = STOP_GRACE
) -> None:
    """Stop ``processes`` and every process below them: ``sig``, then SIGKILL after ``grace`` s.

    Flower starts some helpers in sessions of their own (the SuperLink's
    SuperExec), so a process group alone is not enough: the descendants are
    found before the signal. With ``groups``, each process's group (it leads
    one: ``start_new_session``) is signalled too, while the process still
    runs (then its group id is still its own). What still runs after
    ``grace`` s gets SIGKILL. Never raises, and returns after at most
    ``grace`` + 5 s.
    """
    members: dict[int, psutil.Process] = {}
    for process in processes:
        members[process.pid] = process
        with contextlib.suppress(psutil.Error):
            members.update({child.pid: child for child in process.children(recursive=True)})

    def send(signal_number: int) -> None:
        for process in processes if groups else ():
            if running(process):
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal_number)
        for member in members.values():
            _signal(member, signal_number)

    if not members:
        return
    send(sig)
    if sig == signal.SIGKILL:
        psutil.wait_procs(list(members.values()), timeout=5)
        return
    _, alive = psutil.wait_procs(list(members.values()), timeout=grace)
    if alive:
        members = {process.pid: process for process in alive}
        send(signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)


def marked_processes(marker: str) -> list[psutil.Process]:
    """The processes whose environment carries ``marker`` (:data:`FEDERATION_VARIABLE`).

    A process the SuperLink started just before the stop (a ServerApp or a
    simulation starting a run) is not among the descendants found at the
    stop, and once its parent is gone it is no longer below anything of ours;
    it still carries the marker. Left running, it would write into the
    federation's folders after they are removed.
    """
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(FEDERATION_VARIABLE) == marker:
                found.append(process)
        except psutil.Error:
            continue
    return found


def _descendants(pid: int) -> list[int]:
    """Ids of all processes below ``pid`` (none when it has ended)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
