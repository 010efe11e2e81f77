"""The owner command line, tmi."""
