"""The PAI-DLC OpenAPI emulator and the fixtures that start it."""
