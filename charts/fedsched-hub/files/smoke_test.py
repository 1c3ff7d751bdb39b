"""The fedsched-hub chart's `helm test`: the hub answers, and only as it should.

1. The SuperLink serves TLS with a certificate valid for its Service name (checked against the
   SuperLink's CA), on the one port the gateway, the SuperExec and this test may reach.
2. The gateway serves TLS and refuses a client without a member certificate (nginx's 400
   "No required SSL certificate was sent"): mutual TLS is enforced.

    python smoke_test.py SUPERLINK_HOST:PORT GATEWAY_HOST:PORT SUPERLINK_CA
"""

import socket
import ssl
import sys


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def superlink_ok(address: str, ca_file: str) -> None:
    host, port = _split(address)
    ctx = ssl.create_default_context(cafile=ca_file)
    with socket.create_connection((host, port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=host):
        pass  # handshake done and the certificate verified for the Service name
    print(f"superlink {address}: TLS verified")


def gateway_requires_client_certificate(address: str) -> None:
    host, port = _split(address)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the gateway's name is the public one; only mTLS is checked
    with socket.create_connection((host, port), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
        tls.sendall(f"POST /v1/fleet/get-run HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
                    "Connection: close\r\n\r\n".encode())
        answer = b""
        while chunk := tls.recv(4096):
            answer += chunk
    text = answer.decode(errors="replace")
    if not text.startswith("HTTP/1.1 400") or "No required SSL certificate was sent" not in text:
        raise SystemExit(f"gateway {address} did not refuse a client without a certificate:\n{text[:500]}")
    print(f"gateway {address}: refuses clients without a member certificate")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    superlink_ok(sys.argv[1], sys.argv[3])
    gateway_requires_client_certificate(sys.argv[2])
