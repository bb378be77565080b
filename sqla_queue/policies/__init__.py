"""What wraps a handler or a batch: retries, leases, time and rate limits, fairness, hooks."""
