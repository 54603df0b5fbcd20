"""The Kubernetes API server emulator, its fixtures and the pods-platform harness."""
