"""Suite-wide settings: keep every test's traffic on loopback."""
import os

# gRPC honours http_proxy; tests talk to 127.0.0.1 only and must never go through a proxy.
for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy"):
    os.environ.pop(var, None)
os.environ["no_proxy"] = os.environ["NO_PROXY"] = "127.0.0.1,localhost,::1"
