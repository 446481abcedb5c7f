"""Socket helpers for the tests that play a misbehaving peer."""
import socket


def closed_by_peer(sock):
    """True when the other side closes the connection (after anything it
    still had to send); False if it stays open until the socket timeout."""
    try:
        while sock.recv(65536):
            pass
        return True
    except socket.timeout:
        return False
