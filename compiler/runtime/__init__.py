"""Runtime: the plan (kernel calls), the CPU executor, vendor (extern) kernels, the GPU plan and timing, artifacts and CompiledModel, targets and the tuning database. Imports ir and backends only."""
