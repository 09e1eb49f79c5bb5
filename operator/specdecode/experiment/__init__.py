"""The pure core: spec and status models, validation, manifests, PromQL, decisions, statistics.

No kopf, no Kubernetes client, no HTTP client here (import-linter enforces it).
"""
