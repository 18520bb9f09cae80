"""A DNS server on 127.0.0.1:53 that logs every queried name and answers NXDOMAIN.

Inside the run's namespace, where /etc/resolv.conf names only 127.0.0.1, it shows which outside hosts a
CLI tried to reach. Nothing could reach them anyway (the namespace has no route out); this makes the
attempts visible so that telemetry and update switches can be checked.
"""

from __future__ import annotations

import socket
import struct
import threading


def _qname(packet: bytes) -> tuple[str, int]:
    """The first question's name and the offset just past the question (type and class included)."""
    labels, i = [], 12
    while i < len(packet) and packet[i]:
        n = packet[i]
        labels.append(packet[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    return ".".join(labels), i + 5


class DnsLogger:
    def __init__(self, host: str = "127.0.0.1", port: int = 53):
        self.names: list[str] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, port))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> DnsLogger:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                packet, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            if len(packet) < 12:
                continue
            name, end = _qname(packet)
            self.names.append(name)
            (ident, flags) = struct.unpack("!HH", packet[:4])
            reply_flags = 0x8000 | (flags & 0x0100) | 0x0080 | 3  # response, RD copied, RA, NXDOMAIN
            reply = struct.pack("!HHHHHH", ident, reply_flags, 1, 0, 0, 0) + packet[12:end]
            try:
                self._sock.sendto(reply, peer)
            except OSError:
                pass
