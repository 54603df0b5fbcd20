"""The fault-injecting TCP relay and the `relayed` backend that routes agents through it."""
