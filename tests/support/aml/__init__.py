"""The AML emulator (ARM, the workspace job API, the az CLI stand-in) and the fixtures that start it."""
