"""The files temper writes and reads back: a bundle's runtime.json and manifest, its capacity.json, and a
model repository with its ensembles. Built on core/ and engines/; read by the gates, the server, the
Triton export and the registry alike."""
