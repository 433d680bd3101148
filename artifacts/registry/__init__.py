"""MLflow: publishing a gated bundle as a registered model, the pyfunc model that serves it, and pulling
a version back by alias. The top of artifacts/: it runs a bundle with serving/'s Runtime."""
