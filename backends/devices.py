"""Device specs: the ceilings of the roofline model, as plain data.

Every number comes from the vendor's public documents, named in ``sources``; peak FLOP/s are the
dense (no structured sparsity) figures. NVIDIA's datasheets print tensor-core peaks *with* 2:4
sparsity (marked ``*``); the dense figure is half of that, as the Hopper whitepaper's tables state.

Sources:

* [H100-DS] NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100, 2023):
  H100 SXM: FP64 34 TFLOPS, FP64 Tensor 67, FP32 67, TF32 Tensor 989*, BF16/FP16 Tensor 1,979*,
  FP8 Tensor 3,958*, INT8 Tensor 3,958* TOPS (* with sparsity); 80 GB HBM3 at 3.35 TB/s.
* [H100-WP] NVIDIA H100 Tensor Core GPU Architecture whitepaper (v1.0x, 2022), table "H100 SXM5":
  132 SMs; FP16/BF16 non-tensor 133.8 TFLOPS; FP32 66.9; FP64 33.5; dense tensor FP16/BF16 989.4,
  TF32 494.7, FP8 1,978.9, INT8 1,978.9 TOPS; FP64 tensor 66.9.
* [HOPPER-TG] NVIDIA Hopper Tuning Guide (CUDA 12 docs), "Shared memory": 228 KB per SM, at most
  227 KB per thread block.
* [H200-DS] NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200, 2024):
  H200 SXM: the same compute figures as H100 SXM (same GH100 chip, 132 SMs); 141 GB HBM3e at
  4.8 TB/s.
* Launch overhead is not a datasheet figure: 4 us is the typical measured cost of one CUDA kernel
  launch plus its tail on Hopper with a Python launcher (Triton's own benchmarks show 3-5 us); it is
  replaced by a measurement on a real GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

TERA = 1e12


@dataclass(frozen=True)
class DeviceSpec:
    """Ceilings of one GPU.

    Attributes:
        name: short name (``h100-sxm``).
        tensor_flops: dense tensor-core peak in FLOP/s per dtype name (``f32`` means TF32, which
            Triton's ``tl.dot`` uses for fp32 by default).
        vector_flops: CUDA-core (non-tensor) peak in FLOP/s per dtype name (an FMA counts 2).
        hbm_bandwidth: bytes per second.
        sm_count: streaming multiprocessors.
        smem_per_block: bytes of shared memory one thread block may use.
        launch_overhead_s: seconds added per kernel launch.
        sources: where each number comes from.
    """
    name: str
    tensor_flops: dict[str, float]
    vector_flops: dict[str, float]
    hbm_bandwidth: float
    sm_count: int
    smem_per_block: int
    launch_overhead_s: float
    sources: dict[str, str] = field(default_factory=dict)

    def as_ceilings(self) -> dict:
        """The plain-data form the extraction cost model takes (``lumc.rewrites.cost``)."""
        return {"name": self.name, "tensor_flops": dict(self.tensor_flops),
                "vector_flops": dict(self.vector_flops), "bandwidth": self.hbm_bandwidth,
                "launch_s": self.launch_overhead_s}


_HOPPER_TENSOR = {"f64": 66.9 * TERA, "f32": 494.7 * TERA, "f16": 989.4 * TERA,
                  "bf16": 989.4 * TERA, "i8": 1978.9 * TERA, "u8": 1978.9 * TERA}
_HOPPER_VECTOR = {"f64": 33.5 * TERA, "f32": 66.9 * TERA, "f16": 133.8 * TERA,
                  "bf16": 133.8 * TERA, "i64": 33.5 * TERA, "i32": 33.5 * TERA,
                  "i8": 33.5 * TERA, "u8": 33.5 * TERA, "bool": 33.5 * TERA}
_HOPPER_SOURCES = {
    "tensor_flops": "[H100-WP] dense tensor-core peaks (half of [H100-DS]'s sparse figures)",
    "vector_flops": "[H100-WP] non-tensor peaks; integer ALU rate taken as the FP64 rate (a floor)",
    "sm_count": "[H100-WP] 132 SMs on H100 SXM5; [H200-DS] same GH100 configuration",
    "smem_per_block": "[HOPPER-TG] 227 KB per thread block",
    "launch_overhead_s": "estimate (not a datasheet figure), replaced by measurement on a GPU",
}

H100_SXM = DeviceSpec(
    name="h100-sxm", tensor_flops=_HOPPER_TENSOR, vector_flops=_HOPPER_VECTOR,
    hbm_bandwidth=3.35 * TERA, sm_count=132, smem_per_block=227 * 1024, launch_overhead_s=4e-6,
    sources={**_HOPPER_SOURCES, "hbm_bandwidth": "[H100-DS] 3.35 TB/s HBM3"})

H200 = DeviceSpec(
    name="h200", tensor_flops=_HOPPER_TENSOR, vector_flops=_HOPPER_VECTOR,
    hbm_bandwidth=4.8 * TERA, sm_count=132, smem_per_block=227 * 1024, launch_overhead_s=4e-6,
    sources={**_HOPPER_SOURCES, "hbm_bandwidth": "[H200-DS] 4.8 TB/s HBM3e"})

DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (H100_SXM, H200)}
_ALIASES = {"h100": "h100-sxm", "h100sxm": "h100-sxm", "h100-sxm5": "h100-sxm", "h200-sxm": "h200"}


def get_device(name: str) -> DeviceSpec:
    """The spec of a named device (case-insensitive; ``h100`` means H100 SXM).

    Raises:
        KeyError: for an unknown device; the message lists the known ones.
    """
    key = name.lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key not in DEVICES:
        raise KeyError(f"unknown device {name!r}; known: {sorted(DEVICES)}")
    return DEVICES[key]
