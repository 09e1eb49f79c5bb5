"""The kopf operator: the only code that talks to Kubernetes and Prometheus."""
