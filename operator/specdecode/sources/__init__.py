"""Reading the outside systems that measure the arms into the core's types (`prometheus.py`).

Shared by the operator and `run --local`: it imports only the core (`specdecode.experiment`).
"""
