"""Integration tests: the servers in-process, through aiohttp's test client and real TLS."""
