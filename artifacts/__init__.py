"""The bottom layer: what ships inside every MLflow model, and what every layer above shares.

Its sub-packages are floors, bottom first; each imports only itself and the floors below it
(tests/test_layers.py):

    core/      errors, ONNX files, batch layouts, host facts, folders temper may delete
    engines/   the runtimes a model is gated and served on (ONNX Runtime, OpenVINO)
    formats/   bundle, manifest, capacity.json, model repositories and their ensembles
    triton/    what export-triton writes: config.pbtxt, ensembles, manifests, alerts
    serving/   temper serve: the Runtime, its batcher and workers, the REST and gRPC servers
    registry/  MLflow: publish, the pyfunc model, pull by alias
"""
