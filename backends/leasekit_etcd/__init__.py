"""The etcd backend for leasekit: not implemented yet, and not registered as a scheme."""
