"""A stand-in remusdbd for the CLI's tests without a lab: a unix socket
that reads one request line per connection and answers it, as remusdbd's
control socket does, with what the test's `reply_for(request)` returns."""
import json
import socket
import threading
from contextlib import contextmanager


@contextmanager
def stand_in_daemon(path, reply_for):
    """Serves on `path` until the block ends; yields the path."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.2)  # so that the loop sees the end of the block
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                reply = reply_for(json.loads(data))
                conn.sendall(json.dumps(reply).encode() + b"\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield path
    finally:
        stop.set()
        t.join()
        server.close()
