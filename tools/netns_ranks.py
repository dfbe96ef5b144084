"""Emulate several machines on one Linux box: one network namespace per rank, a shaped link each.

    sudo python tools/netns_ranks.py run --ranks 2 --rate 1gbit [--timeout 600] -- \\
        .venv/bin/python -m edge0 run MODEL -p "def f(x):" --hosts {hosts}
    sudo python tools/netns_ranks.py probe --rate 1gbit      # what the link gives: MB/s, RTT
    sudo python tools/netns_ranks.py down --all              # remove leftovers of killed runs

`run` creates N namespaces `e0r-TAG-0..N-1` and a hub namespace `e0r-TAG-hub` holding
a bridge (the switch); each rank namespace gets one veth to the bridge with the address
10.213.0.(r+1)/24, and both ends of every veth get a `tbf` qdisc at `--rate` (each
machine has a NIC of that speed into the switch; `none` leaves the link unshaped). It
writes an mlx.launch hosts file naming those namespaces and addresses, runs the command
in rank 0's namespace with `{hosts}` replaced by the file's path and `EDGE0_SSH` set to
this tool's `ssh` shim (so `--hosts FILE` starts rank r with `ip netns exec e0r-TAG-r`
instead of ssh), kills the command after `--timeout` seconds, and always tears every
namespace down again, killing what still runs in them. Nothing is added to the host's
own network namespace: the addresses exist only inside the namespaces created here.

Needs root and `ip`/`tc` (iproute2) with veth, bridge and tbf in the kernel; anything
else is a one-line error (exit 2).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

PREFIX = "e0r-"
SUBNET = "10.213.0"
MTU_FRAME = 1514  # bytes on the wire per full-size Ethernet frame (MTU 1500 + header)
_RATE = re.compile(r"^\d+(\.\d+)?[kmg]?bit$")


class NetnsError(Exception):
    """A machine or an argument this tool cannot work with (the message says why)."""


def sh(*argv: str, check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc.stdout


def check_rate(rate: str) -> str:
    if rate != "none" and not _RATE.match(rate):
        raise NetnsError(f"--rate {rate!r}: give tc's form, e.g. 1gbit, 10gbit, 500mbit, or none")
    return rate


def auto_burst(rate: str) -> int:
    """The tbf bucket: what the link sends in 10 us, at least two full frames. A message
    larger than the bucket waits for the link (serialisation, as on a real NIC); a smaller
    bucket only adds the shaper's timer wake-ups (measured with `probe`)."""
    if rate == "none":
        return 2 * MTU_FRAME
    num = float(rate[: -len("bit")].rstrip("kmg"))
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}.get(rate[-4], 1.0)
    return max(2 * MTU_FRAME, int(num * scale / 8 * 10e-6))


class Namespaces:
    """The namespaces of one emulated cluster: create, shape, describe, tear down."""

    def __init__(self, ranks: int, tag: str | None = None) -> None:
        if ranks < 1:
            raise NetnsError(f"--ranks {ranks}: need at least 1")
        self.ranks = ranks
        self.tag = tag or str(os.getpid())
        self.hub = f"{PREFIX}{self.tag}-hub"
        self.names = [f"{PREFIX}{self.tag}-{r}" for r in range(ranks)]
        self.ips = [f"{SUBNET}.{r + 1}" for r in range(ranks)]
        self.dir = Path(tempfile.mkdtemp(prefix="edge0-netns-"))
        self.hosts_file = self.dir / f"hosts-{ranks}.json"
        self.rate, self.burst = "none", 2 * MTU_FRAME

    def up(self, rate: str, burst: int | None = None) -> None:
        """1. hub + bridge; 2. per rank a namespace and a veth into the bridge; 3. shaping."""
        if os.geteuid() != 0:
            raise NetnsError("network namespaces need root (run it with sudo)")
        sh("ip", "netns", "add", self.hub)
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        for r, (name, ip) in enumerate(zip(self.names, self.ips, strict=True)):
            sh("ip", "netns", "add", name)
            port = f"r{r}"
            sh(
                "ip",
                "-n",
                self.hub,
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                name,
            )
            sh("ip", "-n", self.hub, "link", "set", port, "master", "br0", "up")
            sh("ip", "-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", name, "link", "set", "eth0", "up")
            sh("ip", "-n", name, "link", "set", "lo", "up")
        self.shape(rate, burst)
        self.hosts_file = self.hosts_for(self.ranks)

    def shape(self, rate: str, burst: int | None = None) -> None:
        """Both ends of every rank's link at `rate` (`none`: the veth's own, unshaped)."""
        burst = burst or auto_burst(check_rate(rate))
        self.rate, self.burst = rate, burst
        ends = [(self.hub, f"r{r}") for r in range(self.ranks)] + [(n, "eth0") for n in self.names]
        for ns, dev in ends:
            sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
            if rate != "none":
                sh(
                    "tc",
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    str(burst),
                    "latency",
                    "50ms",
                )

    def hosts_for(self, n: int) -> Path:
        """A hosts file naming the first `n` ranks' namespaces and addresses."""
        path = self.dir / f"hosts-{n}.json"
        hosts = [{"ssh": name, "ips": [ip]} for name, ip in zip(self.names, self.ips, strict=True)]
        path.write_text(json.dumps({"hosts": hosts[:n]}) + "\n")
        return path

    def exec_argv(self, rank: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.names[rank], *argv]

    def env(self) -> dict[str, str]:
        """The environment for rank 0: `--hosts FILE` starts the others in their namespaces."""
        return dict(os.environ, EDGE0_SSH=f"{sys.executable} {Path(__file__).resolve()} ssh")

    def down(self) -> None:
        teardown([*self.names, self.hub])
        for f in self.dir.iterdir():
            f.unlink()
        self.dir.rmdir()


def ours() -> list[str]:
    """Every namespace this tool made (by its prefix), e.g. left over by a killed run."""
    return [ln.split()[0] for ln in sh("ip", "netns", "list").splitlines() if ln.startswith(PREFIX)]


def teardown(names: list[str]) -> None:
    """Kill what still runs in the namespaces (only processes this tool started), delete them."""
    present = set(ours())
    for name in names:
        if name not in present:
            continue
        for _ in range(50):
            pids = [int(p) for p in sh("ip", "netns", "pids", name, check=False).split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        sh("ip", "netns", "del", name, check=False)


def run_in(ns: Namespaces, argv: list[str], timeout: float) -> int:
    """The command in rank 0's namespace, `{hosts}` replaced; killed after `timeout` s."""
    argv = [a.replace("{hosts}", str(ns.hosts_file)) for a in argv]
    proc = subprocess.Popen(ns.exec_argv(0, argv), env=ns.env(), start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f"netns_ranks: the command ran past {timeout:g} s and was killed", file=sys.stderr)
        return 124


@click.group()
def main() -> None:
    """One network namespace per rank, joined by shaped veth links (see the module doc)."""


RANKS = click.option("--ranks", type=click.IntRange(1, 64), default=2, show_default=True)
RATE = click.option(
    "--rate",
    default="1gbit",
    show_default=True,
    help="tbf rate on every link end (tc's units), or none",
)
BURST = click.option(
    "--burst",
    type=click.IntRange(MTU_FRAME),
    default=None,
    help="tbf bucket in bytes [default: what the link sends in 10 us, at least two full frames]",
)


@main.command(context_settings={"ignore_unknown_options": True})
@RANKS
@RATE
@BURST
@click.option("--timeout", type=click.FloatRange(1), default=600, show_default=True)
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def run(ranks: int, rate: str, burst: int | None, timeout: float, argv: tuple[str, ...]) -> None:
    """Set up, run ARGV in rank 0's namespace ({hosts} = the hosts file), tear down."""
    ns = Namespaces(ranks)
    try:
        check_rate(rate)
        ns.up(rate, burst)
        rc = run_in(ns, list(argv), timeout)
    except NetnsError as exc:
        rc = fail(str(exc))
    finally:
        ns.down()
    sys.exit(rc)


@main.command()
@RATE
@BURST
@click.option("--mib", type=click.IntRange(1), default=64, show_default=True)
def probe(rate: str, burst: int | None, mib: int) -> None:
    """Bulk TCP MB/s and the round trip of one pipeline message (8,256 B) between 2 ranks."""
    ns = Namespaces(2)
    try:
        ns.up(check_rate(rate), burst)
        me = [sys.executable, str(Path(__file__).resolve())]
        server = subprocess.Popen(ns.exec_argv(1, [*me, "serve", ns.ips[1]]))
        try:
            out = sh(*ns.exec_argv(0, [*me, "client", ns.ips[1], str(mib)]))
        finally:
            server.kill()
            server.wait()
        print(json.dumps(dict(rate=rate, burst=ns.burst, **json.loads(out))))
    except NetnsError as exc:
        sys.exit(fail(str(exc)))
    finally:
        ns.down()


PROBE_PORT = 32999
MESSAGE = 8256  # bytes of one pipeline hop on the 35B shape: 4 x (8 + 8 + 2048)


@main.command(hidden=True)
@click.argument("ip")
def serve(ip: str) -> None:
    """probe's far end: echo MESSAGE-byte messages, then count bulk bytes until EOF."""
    srv = socket.create_server((ip, PROBE_PORT))
    with srv.accept()[0] as conn:  # ping-pong
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while msg := _recv(conn, MESSAGE):
            conn.sendall(msg)
    with srv.accept()[0] as conn:  # bulk
        total = 0
        while chunk := conn.recv(1 << 20):
            total += len(chunk)
        conn.sendall(total.to_bytes(8, "little"))


@main.command(hidden=True)
@click.argument("ip")
@click.argument("mib", type=int)
def client(ip: str, mib: int) -> None:
    """probe's near end: median round trip of 200 messages, then MB/s of `mib` MiB."""
    conn = _connect(ip)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg, trips = os.urandom(MESSAGE), []
    for _ in range(200):
        t0 = time.perf_counter()
        conn.sendall(msg)
        _recv(conn, MESSAGE)
        trips.append(time.perf_counter() - t0)
    conn.close()
    conn = _connect(ip)
    block, t0 = bytes(1 << 20), time.perf_counter()
    for _ in range(mib):
        conn.sendall(block)
    conn.shutdown(socket.SHUT_WR)
    got = int.from_bytes(_recv(conn, 8), "little")
    secs = time.perf_counter() - t0
    trips.sort()
    print(
        json.dumps(
            dict(
                message_bytes=MESSAGE,
                rtt_ms_median=trips[100] * 1e3,
                rtt_ms_p90=trips[180] * 1e3,
                bulk_mib=got / 2**20,
                bulk_mb_s=got / secs / 1e6,
            )
        )
    )


def _connect(ip: str) -> socket.socket:
    for _ in range(100):  # the server may still be starting
        try:
            return socket.create_connection((ip, PROBE_PORT), timeout=30)
        except ConnectionRefusedError:
            time.sleep(0.05)
    raise NetnsError(f"no probe server at {ip}:{PROBE_PORT}")


def _recv(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return bytes(buf)
        buf += chunk
    return bytes(buf)


@main.command()
@click.option("--all", "everything", is_flag=True, help="every namespace named e0r-*")
@click.option("--tag", help="the namespaces e0r-TAG-*")
def down(everything: bool, tag: str | None) -> None:
    """Tear down namespaces left by a run that was killed before it could clean up."""
    if not everything and not tag:
        sys.exit(fail("say which: --tag TAG or --all"))
    names = ours() if everything else [n for n in ours() if n.startswith(f"{PREFIX}{tag}-")]
    teardown(names)
    print(f"removed {len(names)} namespace(s)")


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("host")
@click.argument("command")
def ssh(host: str, command: str) -> None:
    """The EDGE0_SSH shim: run COMMAND in the namespace HOST (this tool's namespaces only)."""
    if not host.startswith(PREFIX):
        sys.exit(fail(f"host {host!r} is not a namespace made by this tool ({PREFIX}*)"))
    os.execvp("ip", ["ip", "netns", "exec", host, "sh", "-c", command])


def fail(msg: str) -> int:
    print(f"netns_ranks: error: {msg}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    main()
