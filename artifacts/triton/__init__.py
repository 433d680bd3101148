"""What `temper export-triton` writes for Triton and Kubernetes: config.pbtxt, ensembles, the cluster's
manifests, alert rules and autoscaling. Reads formats/; the server reads config.py to answer /config as
Triton does."""
