"""The leasekit conformance suite."""
