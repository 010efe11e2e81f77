"""End-to-end tests against the real control plane the fixtures start."""
