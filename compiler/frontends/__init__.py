"""Frontends: ONNX and PyTorch models to primitive graphs, and the known real models. Imports runtime, ir and backends."""
