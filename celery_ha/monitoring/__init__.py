"""Monitoring: Prometheus metrics computed from the durable state, the web dashboard."""
