"""The gateway's listening socket: bound before anything loads, and streaming without Nagle's delay."""
from __future__ import annotations

import asyncio
import socket

import pytest

from gateway.server import bind
from tests.services import free_port


def test_connections_accepted_on_the_gateways_socket_have_tcp_nodelay():
    # Without TCP_NODELAY each streamed piece after the first waits for the client's delayed ACK
    # (about 40 ms): measured as +31 ms to the first SSE token before this was fixed.
    async def main():
        seen = asyncio.get_running_loop().create_future()

        async def on_client(reader, writer):
            sock = writer.get_extra_info("socket")
            seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_client, sock=bind("127.0.0.1", free_port()))
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        value = await asyncio.wait_for(seen, 5)
        writer.close()
        server.close()
        return value

    assert asyncio.run(main()) == 1


def test_a_taken_port_stops_the_gateway_with_a_message_naming_it():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(SystemExit, match=f"port {port} on 127.0.0.1 is in use"):
            bind("127.0.0.1", port)
