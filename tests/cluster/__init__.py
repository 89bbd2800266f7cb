"""Real-host test cluster for the ssh backend: sshd on loopback and namespace hosts (docs/testing.md)."""
