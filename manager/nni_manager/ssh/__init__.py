"""SSH plumbing for the remote backend: connect, tunnel, build and install the agent."""
