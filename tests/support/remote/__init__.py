"""sshd in network namespaces, SSH keys and the other fixtures of the SSH-platform tests."""
