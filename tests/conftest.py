"""Suite-wide settings: loopback only, and trials that run the tests' own Python."""
import os
import sys

# gRPC honours http_proxy; tests talk to 127.0.0.1 only and must never go through a proxy.
for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy"):
    os.environ.pop(var, None)
os.environ["no_proxy"] = os.environ["NO_PROXY"] = "127.0.0.1,localhost,::1"

# Trial commands such as `python train.py` (NNI's usual form) must find the interpreter that
# has this package installed, as they would in a user's activated virtual environment.
_bin = os.path.dirname(sys.executable)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _bin:
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")
