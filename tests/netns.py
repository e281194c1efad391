"""A host of its own behind a router, for partition tests: network namespaces and veth pairs.

``Network()`` makes two namespaces with unique names, a router and a node, joined by veth pairs::

    root namespace                    router                        node
    database 10.R.S.1, broker 10.R.S.3 --veth-- 10.R.S.2 | 10.R.S.9 --veth-- 10.R.S.10

The root namespace (where the test, its PostgreSQL and its broker run) reaches the node through
the router, which forwards. ``cut(database=True, broker=False)`` drops the packets between the
node and the chosen addresses of the root namespace in the router (policy rules of type
``blackhole``; with ``replies_only``, those towards the node only): dropped in transit, not
refused, and not dropped by a queue of the sender's own, which a TCP sender would see and retry
without counting a lost keepalive probe. Both ends see nothing at all, as across a broken
switch. ``heal()`` removes the rules. ``node_command(...)``
is the prefix that runs a command in the node (``ip netns exec NAME``), in the same process
(``ip`` execs it), so its process id and signals are the command's own.

Needs root (``ip netns add``) and Debian's iproute2; ``close()`` deletes both namespaces, which
deletes their veths and the route to them, whatever state they are in.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import uuid


def unavailable() -> str | None:
    """Return why network namespaces cannot be made here (not root, no ``ip``), else None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if not os.path.exists("/usr/sbin/ip") and not os.path.exists("/sbin/ip"):
        return "iproute2's ip is not installed (apt-get install iproute2)"
    return None


def _ip(*args: str, netns: str | None = None) -> str:
    command = ["ip", *(("-n", netns) if netns else ()), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return done.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A /28 of 10.200.0.0/13 no interface of the root namespace uses, picked at random."""
    used = [
        ipaddress.ip_interface(word).network
        for line in _ip("-o", "-4", "addr", "show").splitlines()
        for word in line.split()[3:4]
    ]
    pool = ipaddress.ip_network("10.200.0.0/13")
    for _ in range(100):
        index = int.from_bytes(os.urandom(2), "big") % (pool.num_addresses // 16)
        subnet = ipaddress.ip_network(f"{pool.network_address + index * 16}/28")
        if not any(subnet.overlaps(net) for net in used):
            return subnet
    raise RuntimeError("no free /28 in 10.200.0.0/13")


class Network:
    """A router and a node namespace; ``database`` and ``broker`` are root-side addresses."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.router, self.node = f"slr-{tag}", f"sln-{tag}"
        net = _free_subnet().network_address
        self.database, self.router_inside, self.broker = (str(net + i) for i in (1, 2, 3))
        self.router_outside, self.node_address = str(net + 9), str(net + 10)
        self._links = (f"sl{tag}a", f"sl{tag}b", f"sl{tag}c", f"sl{tag}d")
        self._cut: list[tuple[str, str]] = []
        try:
            self._build(net)
        except BaseException:
            self.close()
            raise

    def _build(self, net: ipaddress.IPv4Address) -> None:
        root_end, router_in, router_out, node_end = self._links
        for name in (self.router, self.node):
            _ip("netns", "add", name)
            _ip("link", "set", "lo", "up", netns=name)
        _ip("link", "add", root_end, "type", "veth", "peer", "name", router_in, "netns", self.router)
        _ip("link", "add", node_end, "netns", self.node, "type", "veth", "peer", "name", router_out,
            "netns", self.router)
        _ip("addr", "add", f"{self.database}/29", "dev", root_end)
        _ip("addr", "add", f"{self.broker}/29", "dev", root_end)
        _ip("link", "set", root_end, "up")
        _ip("route", "add", f"{net + 8}/30", "via", self.router_inside)
        _ip("addr", "add", f"{self.router_inside}/29", "dev", router_in, netns=self.router)
        _ip("addr", "add", f"{self.router_outside}/30", "dev", router_out, netns=self.router)
        for link in (router_in, router_out):
            _ip("link", "set", link, "up", netns=self.router)
        subprocess.run(
            ["ip", "netns", "exec", self.router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
            check=True, capture_output=True, timeout=30,
        )
        _ip("addr", "add", f"{self.node_address}/30", "dev", node_end, netns=self.node)
        _ip("link", "set", node_end, "up", netns=self.node)
        _ip("route", "add", "default", "via", self.router_outside, netns=self.node)

    def node_command(self) -> list[str]:
        """The prefix that runs a command inside the node namespace."""
        return ["ip", "netns", "exec", self.node]

    def cut(
        self, *, database: bool = True, broker: bool = False, replies_only: bool = False
    ) -> None:
        """Drop every packet between the node and the chosen root-side addresses, both ways.

        With ``replies_only`` only the packets from those addresses to the node are dropped:
        what the node sends arrives and is acknowledged, what the server sends back is never
        acknowledged (data in flight on the server's side, where keepalives do not start).
        """
        for address, chosen in ((self.database, database), (self.broker, broker)):
            if not chosen:
                continue
            ways = [(address, self.node_address)]
            if not replies_only:
                ways.append((self.node_address, address))
            for source, target in ways:
                if (source, target) not in self._cut:
                    _ip("rule", "add", "from", source, "to", target, "blackhole",
                        netns=self.router)
                    self._cut.append((source, target))

    def heal(self) -> None:
        """Forward everything again."""
        while self._cut:
            source, target = self._cut.pop()
            _ip("rule", "del", "from", source, "to", target, "blackhole", netns=self.router)

    def close(self) -> None:
        """Delete both namespaces (their veths, the root end and its route go with them)."""
        for name in (self.node, self.router):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30,
                           check=False)
