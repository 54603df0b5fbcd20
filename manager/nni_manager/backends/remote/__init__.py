"""platform: remote — agents on SSH machines: connect, tunnel, install and start the agent."""
