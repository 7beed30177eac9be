"""User tools: the CLI, bench and rivals, inspect (roofline, AOT), output checks, the ONNX backend adapter, the GPU main job. Imports everything below."""
