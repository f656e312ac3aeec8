"""The `alight` command line: parses, loads and calls; the work happens in the library."""
