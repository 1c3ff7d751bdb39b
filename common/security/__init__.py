"""Certificates for every mutual-TLS link: the fleet CA, the hub's server certificate and one
client certificate per member cluster (``certs``).

May import: ``cryptography`` and the standard library only.
"""
