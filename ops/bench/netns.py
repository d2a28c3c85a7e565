"""A network namespace joined to this host by a veth pair: a link the chaos bench can cut.

`brigade bench chaos` runs one worker inside it, Redis and the sentinels listening on the host side
of the pair as well as on loopback, and takes the namespace's end of the link down for a while: the
process keeps running, its packets go nowhere (no reset, as when a machine's network drops), its
heartbeat expires, and when the link comes back its old connections carry on where they stopped.
A TCP proxy could only close or refuse connections, which is not the same fault.

The addresses are a /30 in 10.231.0.0/16 that no interface here has yet: 10.231.N.1 on the host side,
10.231.N.2 in the namespace. Nothing else is routed, so the namespace reaches this host and nothing
beyond it. Needs root (`ip netns add`). The namespace is named after this process, so one left
behind by a bench that was SIGKILLed is recognised, and removed, by the next.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

PREFIX = "brigade-chaos-"
SUBNET = "10.231"


class NamespaceUnavailable(RuntimeError):
    """This host does not let us make a network namespace (not root, no `ip`, no netns support)."""


def _ip(*args: str, namespace: str | None = None) -> str:
    argv = ["ip", "netns", "exec", namespace, "ip", *args] if namespace else ["ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NamespaceUnavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_abandoned() -> list[str]:
    """Remove the namespaces of chaos benches whose process is gone; returns their names."""
    removed = []
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        match = re.fullmatch(re.escape(PREFIX) + r"(\d+)(-[a-z0-9]+)?", name)
        if match and not _alive(int(match.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            removed.append(name)
    return removed


def _free_subnet() -> int:
    used = {int(m) for m in re.findall(re.escape(SUBNET) + r"\.(\d+)\.", _ip("-o", "-4", "addr", "show"))}
    for n in range(256):
        if n not in used:
            return n
    raise NamespaceUnavailable(f"every {SUBNET}.N.0/30 is taken on this host")


@dataclass
class CutLink:
    """One namespace and its link to the host; `command` runs a program inside it."""

    name: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str
    cut_now: bool = False

    @classmethod
    def create(cls, tag: str = "") -> "CutLink":
        """`tag` (a few lowercase letters or digits): a second namespace of the same process, as a
        test that puts each part of a fleet in a namespace of its own makes."""
        remove_abandoned()
        pid = os.getpid()
        n = _free_subnet()
        short = f"{pid % 100000}{tag[:3]}"
        link = cls(f"{PREFIX}{pid}" + (f"-{tag}" if tag else ""), f"bch{short}h", f"bch{short}n", f"{SUBNET}.{n}.1",
                   f"{SUBNET}.{n}.2")
        _ip("netns", "add", link.name)
        try:
            _ip("link", "add", link.host_if, "type", "veth", "peer", "name", link.ns_if)
            _ip("link", "set", link.ns_if, "netns", link.name)
            _ip("addr", "add", f"{link.host_ip}/30", "dev", link.host_if)
            _ip("link", "set", link.host_if, "up")
            _ip("addr", "add", f"{link.ns_ip}/30", "dev", link.ns_if, namespace=link.name)
            _ip("link", "set", link.ns_if, "up", namespace=link.name)
            _ip("link", "set", "lo", "up", namespace=link.name)  # the worker's own metrics listen there
        except NamespaceUnavailable:
            link.remove()
            raise
        return link

    def command(self, argv: list[str]) -> list[str]:
        """argv run inside the namespace (`ip netns exec` execs it: the pid is the program's)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        """The namespace's end down: its packets go nowhere; the host side stays up, so the host
        still reaches its own address on it."""
        _ip("link", "set", self.ns_if, "down", namespace=self.name)
        self.cut_now = True

    def mend(self) -> None:
        _ip("link", "set", self.ns_if, "up", namespace=self.name)
        self.cut_now = False

    def remove(self) -> None:
        """Delete the namespace and the pair (either end's removal removes both). Call it once no
        process runs inside."""
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
