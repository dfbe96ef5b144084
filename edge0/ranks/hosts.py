"""Where the ranks run: `--hosts` (a count, IPs or an mlx.launch hosts.json) -> ring addresses."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from pathlib import Path

import attrs

from edge0.errors import ConfigError

DEFAULT_PORT = 32323  # mlx.launch's default starting port for the ring backend
LAUNCHED = "mlx.launch"  # hosts value: the ranks were started by mlx.launch (MLX_RANK is set)


def launched_rank() -> int | None:
    """This process's rank when mlx.launch started it (MLX_RANK and MLX_HOSTFILE set)."""
    if "MLX_RANK" in os.environ and os.environ.get("MLX_HOSTFILE"):
        return int(os.environ["MLX_RANK"])
    return None


@attrs.frozen
class Host:
    """One rank's machine: how to reach it (ssh name) and the IP the ring listens on."""

    ssh: str
    ip: str

    @property
    def local(self) -> bool:
        return ipaddress.ip_address(self.ip).is_loopback


@attrs.frozen
class Cluster:
    """The ranks in pipeline order (rank 0 first) and the ring backend's address list."""

    hosts: tuple[Host, ...]
    ports: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.hosts)

    def ring_json(self) -> str:
        """MLX_HOSTFILE contents for the ring backend: one ["ip:port"] list per rank."""
        return json.dumps([[f"{h.ip}:{p}"] for h, p in zip(self.hosts, self.ports, strict=True)])

    def address(self, rank: int) -> str:
        return f"{self.hosts[rank].ip}:{self.ports[rank]}"


def parse_hosts(spec: str | int, port: int | None = None) -> Cluster:
    """`2` (two local ranks), `127.0.0.1,127.0.0.1`, or a hosts.json in mlx.launch's format.

    Local-only clusters get free ports from the OS (tests and several runs side by side);
    others use `port`, `port + 1`, ... (mlx.launch's rule; default 32323).
    """
    hosts = _hosts(spec)
    if len(hosts) < 2:
        raise ConfigError(f"--hosts {spec}: a pipeline needs at least 2 ranks, got {len(hosts)}")
    if all(h.local for h in hosts) and port is None:
        ports = _free_ports(len(hosts))
    else:
        start = DEFAULT_PORT if port is None else port
        ports = tuple(start + i for i in range(len(hosts)))
    return Cluster(tuple(hosts), ports)


def _hosts(spec: str | int) -> list[Host]:
    if isinstance(spec, int) or str(spec).isdigit():
        return [Host("127.0.0.1", "127.0.0.1")] * int(spec)
    text = str(spec)
    if text.endswith(".json") or Path(text).is_file():
        return _from_file(Path(text))
    out = []
    for name in text.split(","):
        out.append(Host(name, _ip(name, f"--hosts {text}")))
    return out


def _from_file(path: Path) -> list[Host]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the hosts file ({exc})") from None
    entries = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ConfigError(f'{path}: expected {{"hosts": [{{"ssh": ..., "ips": [...]}}, ...]}}')
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "ssh" not in entry:
            raise ConfigError(f'{path}: host {i} needs an "ssh" name (mlx.launch hostfile format)')
        ips = entry.get("ips") or [entry["ssh"]]
        out.append(Host(str(entry["ssh"]), _ip(str(ips[0]), f"{path}: host {i}")))
    return out


def _ip(name: str, where: str) -> str:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        raise ConfigError(
            f"{where}: {name!r} is not an IP address; the ring backend needs the IP each rank "
            'listens on (give "ips" in hosts.json)'
        ) from None


def _free_ports(n: int) -> tuple[int, ...]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return tuple(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()
