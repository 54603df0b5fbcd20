"""The DLTS REST emulator and the fixtures that start it."""
