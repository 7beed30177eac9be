"""High-level ops built only from primitives (through :class:`lumc.ir.tensor.Tensor`)."""
