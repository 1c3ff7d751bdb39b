"""Test helpers for real Flower 1.42 deployments on loopback (now :mod:`fedsched.experiment.flower`,
which the kwok fleet's hub uses too; re-exported here) (SuperLink, SuperNodes, the mTLS proxies).

Shared by ``tests/coordinator/test_mtls.py`` (the hub link with ``coordinator/mtls.py``'s
configs) and ``tests/charts/test_chart_federation.py`` (the same link with the configs and
flags the Helm charts render): nginx and stunnel, waiting for a port to open, SuperNode
authentication keys, the operator's ``flwr`` connection, and a federated run checked for
``finished:completed``. Imports :mod:`fedsched.experiment.flower` only.
"""

from __future__ import annotations

from fedsched.experiment.flower import BIN as BIN
from fedsched.experiment.flower import FLOWER_BINS as FLOWER_BINS
from fedsched.experiment.flower import FLOWER_ENV as FLOWER_ENV
from fedsched.experiment.flower import HOST as HOST
from fedsched.experiment.flower import NGINX as NGINX
from fedsched.experiment.flower import START_TIMEOUT as START_TIMEOUT
from fedsched.experiment.flower import STUNNEL as STUNNEL
from fedsched.experiment.flower import ec_auth_key as ec_auth_key
from fedsched.experiment.flower import flwr as flwr
from fedsched.experiment.flower import missing_tools as missing_tools
from fedsched.experiment.flower import online_nodes as online_nodes
from fedsched.experiment.flower import run_federation as run_federation
from fedsched.experiment.flower import wait_online as wait_online
from fedsched.experiment.flower import wait_port as wait_port
from fedsched.experiment.flower import write_connection as write_connection
