"""pytest plugin for the leasekit conformance suite."""
