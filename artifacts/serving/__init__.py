"""`temper serve`: the Runtime (batcher, isolated workers, shared memory), the REST and gRPC servers
that speak the Open Inference Protocol, the model repository's control, the burst fallback and the
metrics. Imported by the pipeline's CLI and the MLflow model, never by the layers below."""
