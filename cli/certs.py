"""``fedsched certs``: a small CA for the hub link's mutual TLS (init, issue, show).

  fedsched certs init  --dir pki --hub-host hub.example.org --hub-ip 10.0.0.5
  fedsched certs issue --dir pki --name cluster-a                  # pki/clients/cluster-a.{key,crt}
  fedsched certs issue --dir pki --name cluster-a --kind server --host extender.kube-system.svc
  fedsched certs show  --dir pki [--name cluster-a] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedsched.common.security import certs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("certs", help="CA and certificates for mutual TLS on the hub link",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cs = p.add_subparsers(dest="certs_command", metavar="ACTION")
    p.set_defaults(func=lambda args: _help(p))

    fmt = argparse.ArgumentDefaultsHelpFormatter
    pi = cs.add_parser("init", formatter_class=fmt, help="create the CA and the hub's server certificate",
                       description="Create DIR/ca.{key,crt} (self-signed CA) and DIR/hub.{key,crt} (the "
                                   "hub ingress's server certificate).")
    pi.add_argument("--dir", required=True, type=Path, help="certificate directory")
    pi.add_argument("--days", type=int, default=certs.DEFAULT_DAYS, help="hub certificate lifetime (days)")
    pi.add_argument("--ca-days", type=int, default=certs.DEFAULT_CA_DAYS, help="CA lifetime (days)")
    pi.add_argument("--hub-host", action="append", metavar="NAME",
                    help="DNS name of the hub (repeatable; default: localhost)")
    pi.add_argument("--hub-ip", action="append", metavar="IP",
                    help="IP address of the hub (repeatable; default: 127.0.0.1)")
    pi.add_argument("--rsa", action="store_true", help="RSA 2048 keys instead of EC P-256")
    pi.add_argument("--force", action="store_true", help="replace an existing CA")
    pi.set_defaults(func=run_init)

    ps = cs.add_parser("issue", formatter_class=fmt, help="issue a member cluster's certificate",
                       description="Issue a member cluster's certificate signed by the CA in DIR: a client "
                                   "certificate for the hub link (DIR/clients/NAME.*) or, with --kind "
                                   "server, a server certificate for the cluster's extender "
                                   "(DIR/servers/NAME.*).")
    ps.add_argument("--dir", required=True, type=Path, help="certificate directory (with the CA)")
    ps.add_argument("--name", required=True, help="cluster name (a DNS label: [a-z0-9-], 1-63)")
    ps.add_argument("--days", type=int, default=certs.DEFAULT_DAYS, help="lifetime (days)")
    ps.add_argument("--kind", choices=certs.KINDS, default="client")
    ps.add_argument("--host", action="append", default=[], metavar="NAME",
                    help="extra DNS name (repeatable; server default: the cluster name)")
    ps.add_argument("--ip", action="append", default=[], metavar="IP", help="IP address SAN (repeatable)")
    ps.add_argument("--rsa", action="store_true", help="RSA 2048 key instead of EC P-256")
    ps.add_argument("--allow-expired", action="store_true",
                    help="accept --days <= 0 (mints an already-expired certificate; for tests)")
    ps.set_defaults(func=run_issue)

    pw = cs.add_parser("show", help="describe the CA, the hub and the issued certificates",
                       description="Print subject, issuer, serial, validity, SANs, key usage and SHA-256 "
                                   "fingerprint of each certificate, and whether it verifies against the CA.")
    pw.add_argument("--dir", required=True, type=Path, help="certificate directory")
    pw.add_argument("--name", help="only this cluster's certificates")
    pw.add_argument("--json", action="store_true", help="JSON instead of text")
    pw.set_defaults(func=run_show)


def _help(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def run_init(args: argparse.Namespace) -> int:
    res = certs.init_ca(args.dir, days=args.days, ca_days=args.ca_days, hub_hosts=args.hub_host,
                        hub_ips=args.hub_ip, use_rsa=args.rsa, force=args.force)
    hub = certs.describe(res.hub_cert)
    print(f"wrote {res.ca.cert} and {res.ca.key} (CA, {certs.describe(res.ca_cert)['key']}, "
          f"until {certs.describe(res.ca_cert)['not_after']})")
    print(f"wrote {res.hub.cert} and {res.hub.key} (hub server certificate, SANs {_sans(hub)}, "
          f"until {hub['not_after']})")
    if res.stale:
        print(f"warning: {len(res.stale)} previously issued certificate(s) were signed by the old CA and no "
              "longer verify; re-issue them:")
        for p in res.stale:
            print(f"  {p}")
    return 0


def run_issue(args: argparse.Namespace) -> int:
    res = certs.issue(args.dir, args.name, kind=args.kind, days=args.days, hosts=args.host, ips=args.ip,
                      use_rsa=args.rsa, allow_expired=args.allow_expired)
    d = certs.describe(res.cert)
    state = "EXPIRED" if d["expired"] else f"until {d['not_after']}"
    print(f"wrote {res.files.cert} and {res.files.key} ({args.kind} certificate for {args.name}, "
          f"SANs {_sans(d)}, {state})")
    if res.clamped:
        print(f"note: validity cut to the CA's expiry ({d['not_after']})")
    return 0


def _entries(directory: Path, name: str | None) -> list[tuple[str, Path]]:
    if not directory.is_dir():
        raise FileNotFoundError(f"no certificate directory {directory}")
    out: list[tuple[str, Path]] = []
    if name is None:
        out += [("CA", directory / certs.CA_CRT), ("hub", directory / certs.HUB_CRT)]
        out = [(label, p) for label, p in out if p.exists()]
        for kind in certs.KINDS:
            out += [(f"{kind} {n}", certs.leaf_files(directory, n, kind).cert)
                    for n in certs.list_issued(directory, kind)]
        if not out:
            raise FileNotFoundError(f"no certificates in {directory}: "
                                    f"run 'fedsched certs init --dir {directory}'")
        return out
    certs.validate_name(name)
    out = [(f"{kind} {name}", certs.leaf_files(directory, name, kind).cert) for kind in certs.KINDS]
    out = [(label, p) for label, p in out if p.exists()]
    if not out:
        raise FileNotFoundError(f"no certificate for cluster {name!r} in {directory / certs.CLIENTS_DIR} or "
                                f"{directory / certs.SERVERS_DIR}")
    return out


def _sans(d: dict) -> str:
    parts = [f"{k.upper()}:{v}" for k in ("dns", "ip", "uri") for v in d["sans"].get(k, [])]
    return ", ".join(parts) or "none"


def _validity(d: dict) -> str:
    if d["not_yet_valid"]:
        return "NOT YET VALID"
    left = d["days_left"]
    if d["expired"]:
        return f"EXPIRED {-left:g} day{'s' * (-left != 1)} ago"
    return f"{left:g} day{'s' * (left != 1)} left"


def run_show(args: argparse.Namespace) -> int:
    entries = _entries(args.dir, args.name)
    ca_path = args.dir / certs.CA_CRT
    ca = certs.load_cert(ca_path) if ca_path.exists() else None
    records = []
    for label, path in entries:
        cert = certs.load_cert(path)
        d = certs.describe(cert)
        purpose = None if label == "CA" else ("server" if label == "hub" else label.split()[0])
        if ca is None:
            chain = f"unknown (no {certs.CA_CRT})"
        else:
            try:
                certs.verify_chain(cert, ca, purpose)
                chain = "ok"
            except ValueError as e:
                chain = f"FAILED: {e}"
        records.append({"label": label, "path": str(path), "chain": chain, **d})
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    for i, r in enumerate(records):
        if i:
            print()
        eku = r["extended_key_usage"]
        bc = f"CA, path length {r['path_length']}" if r["is_ca"] else "not a CA"
        print(f"{r['label']}  ({r['path']})")
        rows = [
            ("subject", r["subject"]), ("issuer", r["issuer"]), ("serial", r["serial"]),
            ("not before", r["not_before"]), ("not after", f"{r['not_after']} ({_validity(r)})"),
            ("SANs", _sans(r)), ("key", r["key"]), ("key usage", ", ".join(r["key_usage"]) or "none"),
            ("ext. key usage", "any" if eku is None else ", ".join(eku)), ("constraints", bc),
            ("sha256", r["fingerprint_sha256"]), ("chain", r["chain"]),
        ]
        for k, v in rows:
            print(f"  {k + ':':<16}{v}")
    return 0
