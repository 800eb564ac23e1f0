"""What one answered completion costs a Python server before any AMQP or broker work: the floor under
``bench/amqp_send.py``'s receive + complete row.

The SDK completes a message and waits for its outcome before it completes the next, so a server answers
every completion with its own write: nothing to batch. This bench measures, in one run, with the same
clients, what a server pays for that round trip alone (a 48-byte request read, a 48-byte answer written):

- ``asyncio echo``: an asyncio ``Protocol`` on the default event loop (what ``oncebus serve`` runs on),
  one ``transport.write`` per request;
- ``selectors echo``: a plain ``selectors`` loop with non-blocking sockets, no asyncio (the least a Python
  loop can do);
- ``C echo``: the same loop in C with epoll (compiled here with ``cc``; skipped without a compiler), what a
  native server pays.

Each row: round trips a second and the server's CPU microseconds per round trip (user + system, from
``/proc/<pid>/stat``); the clients are ``--clients`` processes with blocking sockets, each doing its
round trips one after another, as SDK receivers complete. Ratios are taken within the run.

Usage: ``python bench/receive_bound.py [--round-trips 20000] [--clients 4] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

FRAME = 48  # about a disposition frame (the SDK's complete, and the server's answer)

C_SERVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#define FRAME 48
int main(void) {
    int listener = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {0};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof address;
    if (bind(listener, (struct sockaddr *)&address, sizeof address) || listen(listener, 64)) return 1;
    getsockname(listener, (struct sockaddr *)&address, &size);
    printf("%d\n", ntohs(address.sin_port));
    fflush(stdout);
    int poll = epoll_create1(0);
    struct epoll_event event = {.events = EPOLLIN, .data.fd = listener}, events[64];
    epoll_ctl(poll, EPOLL_CTL_ADD, listener, &event);
    static char buffers[65536][FRAME];
    static int filled[65536];
    for (;;) {
        int ready = epoll_wait(poll, events, 64, -1);
        for (int i = 0; i < ready; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) {
                int client = accept(listener, NULL, NULL);
                if (client < 0 || client >= 65536) continue;
                setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                fcntl(client, F_SETFL, O_NONBLOCK);
                filled[client] = 0;
                struct epoll_event add = {.events = EPOLLIN, .data.fd = client};
                epoll_ctl(poll, EPOLL_CTL_ADD, client, &add);
                continue;
            }
            ssize_t got = read(fd, buffers[fd] + filled[fd], FRAME - filled[fd]);
            if (got <= 0) {
                if (got < 0 && errno == EAGAIN) continue;
                close(fd);
                continue;
            }
            filled[fd] += got;
            if (filled[fd] == FRAME) {
                filled[fd] = 0;
                if (write(fd, buffers[fd], FRAME) != FRAME) close(fd);
            }
        }
    }
}
"""


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) of process ``pid``, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------ servers
def serve_asyncio(port_out: multiprocessing.Queue[int]) -> None:
    import asyncio

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport
            self.pending = b""
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def data_received(self, data: bytes) -> None:
            data = self.pending + data
            whole = len(data) - len(data) % FRAME
            for start in range(0, whole, FRAME):
                self.transport.write(data[start : start + FRAME])  # one answer per request, as a disposition
            self.pending = data[whole:]

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
        port_out.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


def serve_selectors(port_out: multiprocessing.Queue[int]) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port_out.put(listener.getsockname()[1])
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    pending: dict[socket.socket, bytes] = {}
    while True:
        for key, _ in selector.select():
            if key.data is None:
                client, _ = listener.accept()
                client.setblocking(False)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                selector.register(client, selectors.EVENT_READ, True)
                pending[client] = b""
                continue
            client = pending_socket(key)
            try:
                data = client.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                selector.unregister(client)
                client.close()
                continue
            data = pending[client] + data
            whole = len(data) - len(data) % FRAME
            for start in range(0, whole, FRAME):
                client.send(data[start : start + FRAME])
            pending[client] = data[whole:]


def pending_socket(key: selectors.SelectorKey) -> socket.socket:
    sock = key.fileobj
    assert isinstance(sock, socket.socket)
    return sock


def start_c(workdir: Path) -> tuple[subprocess.Popen[str], int] | str:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return "no C compiler"
    source = workdir / "echo.c"
    source.write_text(C_SERVER)
    binary = workdir / "echo"
    built = subprocess.run([compiler, "-O2", "-o", str(binary), str(source)], capture_output=True, text=True)
    if built.returncode:
        return f"cc failed: {built.stderr.strip()[:200]}"
    process = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, int(process.stdout.readline())


# ------------------------------------------------------------------------------------------ clients
def client(port: int, round_trips: int, barrier: Barrier) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = b"d" * FRAME
        barrier.wait()
        for _ in range(round_trips):
            sock.sendall(request)
            got = 0
            while got < FRAME:
                chunk = sock.recv(FRAME - got)
                if not chunk:
                    raise ConnectionError("the server closed")
                got += len(chunk)
        barrier.wait()


def measure(pid: int, port: int, round_trips: int, clients: int) -> tuple[float, float]:
    """(round trips a second, server CPU us a round trip) of ``clients`` processes on ``port``."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(clients + 1)
    each = round_trips // clients
    workers = [context.Process(target=client, args=(port, each, barrier)) for _ in range(clients)]
    for worker in workers:
        worker.start()
    barrier.wait()
    cpu, started = cpu_seconds(pid), time.perf_counter()
    barrier.wait()
    seconds, used = time.perf_counter() - started, cpu_seconds(pid) - cpu
    for worker in workers:
        worker.join()
    total = each * clients
    return total / seconds, used / total * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=20_000, help="round trips per measurement (all clients)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (default 4, as amqp_send's)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each row; the best is shown")
    args = parser.parse_args()
    print(f"before: load average {os.getloadavg()[0]:.2f}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    context = multiprocessing.get_context("fork")
    servers: dict[str, tuple[int, int, subprocess.Popen[str] | multiprocessing.process.BaseProcess]] = {}
    with tempfile.TemporaryDirectory(prefix="oncebus-bound-") as tmp:
        for name, target in (("asyncio echo (default loop)", serve_asyncio), ("selectors echo", serve_selectors)):
            ports: multiprocessing.Queue[int] = context.Queue()
            process = context.Process(target=target, args=(ports,), daemon=True)
            process.start()
            assert process.pid is not None
            servers[name] = (process.pid, ports.get(timeout=10), process)
        native = start_c(Path(tmp))
        if isinstance(native, str):
            print(f"C echo skipped: {native}")
        else:
            servers["C echo (epoll)"] = (native[0].pid, native[1], native[0])
        best: dict[str, tuple[float, float]] = {}
        try:
            for _ in range(args.repeat):  # rounds interleave the rows, so all see the same load
                for name, (pid, port, _) in servers.items():
                    rate, cpu = measure(pid, port, args.round_trips, args.clients)
                    if name not in best or rate > best[name][0]:
                        best[name] = (rate, cpu)
        finally:
            for _, _, running in servers.values():
                if isinstance(running, subprocess.Popen):
                    running.kill()
                    running.wait()
                else:
                    running.terminate()
    print(f"one answered request per round trip, {FRAME}-byte frames, {args.clients} clients; best of {args.repeat}")
    for name, (rate, cpu) in best.items():
        print(f"  {name:<30} {rate:>9,.0f} round trips/s  server {cpu:6.1f} us/round trip")
    if "C echo (epoll)" in best:
        c_cpu = best["C echo (epoll)"][1]
        for name, (_, cpu) in best.items():
            if name != "C echo (epoll)":  # a tiny run may take less CPU than /proc counts (a tick): no ratio then
                ratio = f"{cpu / c_cpu:.2f}" if c_cpu > 0 else "n/a (too few round trips to measure the C server)"
                print(f"  server CPU {name} / C: {ratio}")
    print(f"after: load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
