"""The operator's side: status, counts, metrics, tracing, the dashboard."""
