"""A raw agent fleet and a stored experiment, for the security tests."""
