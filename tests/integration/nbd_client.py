"""A minimal NBD client (fixed newstyle, OPT_GO, simple replies) used by the
tests to talk to remusdbd's exports directly."""
import socket
import struct

IHAVEOPT = 0x49484156454F5054
OPT_GO = 7
REP_ACK = 1
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH = 0, 1, 2, 3
FLAG_FUA = 1


def recv_exact(sock, n):
    # A loop, not MSG_WAITALL: with a timeout set, Python makes the socket
    # non-blocking and MSG_WAITALL then returns whatever has arrived.
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"NBD server closed the connection ({len(data)}/{n} bytes)")
        data += chunk
    return bytes(data)


def handshake(sock, export):
    """Fixed-newstyle handshake with NBD_OPT_GO on a connected socket;
    returns the export size."""
    hello = recv_exact(sock, 18)
    assert hello[:8] == b"NBDMAGIC", hello
    sock.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
    name = export.encode()
    payload = struct.pack(">I", len(name)) + name + struct.pack(">H", 0)
    sock.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, len(payload)) + payload)
    size = None
    while True:
        _, _, rtype, length = struct.unpack(">QIII", recv_exact(sock, 20))
        body = recv_exact(sock, length) if length else b""
        if rtype == REP_ACK:
            return size
        if rtype & 0x80000000:
            raise ConnectionError(f"NBD option refused: reply type {rtype:#x}")
        if len(body) >= 12 and struct.unpack(">H", body[:2])[0] == 0:  # NBD_INFO_EXPORT
            size = struct.unpack(">Q", body[2:10])[0]


class NBDClient:
    def __init__(self, path, export, timeout=10):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.handle = 0
        self.size = handshake(self.sock, export)

    def _recv(self, n):
        return recv_exact(self.sock, n)

    def request(self, cmd, offset, length, data=b"", flags=0):
        self.handle += 1
        self.sock.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, flags, cmd, self.handle,
                                      offset, length) + data)
        magic, error, handle = struct.unpack(">IIQ", self._recv(16))
        assert magic == SIMPLE_REPLY_MAGIC and handle == self.handle
        payload = self._recv(length) if cmd == CMD_READ and error == 0 else b""
        return error, payload

    def write(self, offset, data, fua=False):
        return self.request(CMD_WRITE, offset, len(data), data, FLAG_FUA if fua else 0)[0]

    def read(self, offset, length):
        return self.request(CMD_READ, offset, length)

    def close(self):
        self.sock.close()
