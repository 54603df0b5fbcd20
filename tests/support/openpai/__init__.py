"""The OpenPAI REST emulator, its fixtures and experiment drivers."""
