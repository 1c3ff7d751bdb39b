"""Probe of the fedsched extender over its mutual TLS (kubelet probes cannot present a certificate).

    python probe.py URL CERT KEY CA [--expect-refused]

GETs URL (e.g. https://127.0.0.1:8443/readyz) with the client certificate CERT/KEY, verifying
the server against CA (not its host name: the probe dials 127.0.0.1, the certificate names the
Service); exits 0 on HTTP 200. With --expect-refused it connects without a certificate instead
and exits 0 only if the server refuses that (the helm test's mutual-TLS check).
"""

import ssl
import sys
import urllib.error
import urllib.request


def context(ca: str, cert: str | None, key: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False
    if cert and key:
        ctx.load_cert_chain(cert, key)
    return ctx


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5) or (len(argv) == 5 and argv[4] != "--expect-refused"):
        print(__doc__, file=sys.stderr)
        return 2
    url, cert, key, ca = argv[:4]
    if len(argv) == 5:
        try:
            urllib.request.urlopen(url, context=context(ca, None, None), timeout=5)
        except (ssl.SSLError, urllib.error.URLError, ConnectionError) as e:
            print(f"{url}: refused without a client certificate ({e})")
            return 0
        print(f"{url}: answered a client without a certificate", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(url, context=context(ca, cert, key), timeout=5) as resp:
            print(f"{url}: {resp.status} {resp.read(200).decode(errors='replace').strip()}")
            return 0 if resp.status == 200 else 1
    except (ssl.SSLError, urllib.error.URLError, ConnectionError) as e:
        print(f"{url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
