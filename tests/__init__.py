"""Test suites: unit (pure core), integration (servers in-process), e2e (real control plane)."""
