"""Register member SuperNode public keys with the hub's SuperLink, idempotently.

Run by the fedsched-hub chart's registration Job (and usable by hand): writes a Flower
connection "hub" to $FLWR_HOME/config.toml, then `flwr supernode register KEY hub --name NAME`
for every KEYS_DIR/NAME.pub. A key the SuperLink already has is left as it is; any other
failure fails the Job. `flwr ... --format json` exits 0 even on failure, so the JSON is read.

    python register.py SUPERLINK_HOST:PORT CA_FILE KEYS_DIR
"""

import json
import os
import subprocess
import sys
from pathlib import Path


def main(address: str, ca_file: str, keys_dir: str) -> int:
    home = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "hub"\n\n[superlink.hub]\naddress = "{address}"\n'
        f'root-certificates = "{ca_file}"\n')
    keys = sorted(Path(keys_dir).glob("*.pub"))
    if not keys:
        print(f"no *.pub keys in {keys_dir}", file=sys.stderr)
        return 1
    failed = []
    for key in keys:
        name = key.name.removesuffix(".pub")
        out = subprocess.run(["flwr", "supernode", "register", str(key), "hub", "--name", name,
                              "--format", "json"], capture_output=True, text=True, check=False)
        try:
            res = json.loads(out.stdout)
        except ValueError:
            res = {"success": False, "error-message": (out.stdout + out.stderr).strip()}
        if res.get("success"):
            print(f"{name}: registered as SuperNode {res.get('node-id')}")
        elif "Public key already in use" in str(res.get("error-message", "")):
            print(f"{name}: already registered")
        else:
            print(f"{name}: registration failed: {res.get('error-message')}", file=sys.stderr)
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
