"""Azurite and bind-mount fixtures for the sharedStorage tests."""
