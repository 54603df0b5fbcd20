"""Manager helpers: forms, waits, a manager in its own process, hubs and agents for hub tests."""
