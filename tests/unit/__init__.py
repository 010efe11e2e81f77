"""Unit tests: the pure core and the servers' pure parts, with no event loop or network."""
