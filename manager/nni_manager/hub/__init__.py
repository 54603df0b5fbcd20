"""The gRPC hub every agent dials, and the TLS material that protects it on a network."""
from nni_manager.hub.server import Hub, HubHandler, version_mismatch
from nni_manager.hub.tls import TlsMaterial

__all__ = ["Hub", "HubHandler", "TlsMaterial", "version_mismatch"]
