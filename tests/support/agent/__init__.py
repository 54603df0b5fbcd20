"""The agent's trial kit, the production hub with a recording handler, and the stub hub for old-manager tests."""
