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
* [TRITON-DOT] Triton ``tl.dot(..., input_precision=...)`` (Triton 3.x language reference):
  ``"tf32x3"`` splits each fp32 operand into a TF32 high part and a TF32 remainder and issues three
  TF32 MMAs (hi*hi + hi*lo + lo*hi), the "3xTF32" scheme of NVIDIA CUTLASS
  (``examples/27_ampere_3xtf32_fast_accurate_tensorop_gemm``): about fp32 accuracy at a third of the
  TF32 peak; ``"ieee"`` multiplies on CUDA cores (FFMA) at the fp32 vector peak.
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
        dot_precisions: the operand precisions a contraction may run at, per operand dtype name
            (``{"f32": ("tf32x3", "ieee")}``): the compile's precision policy. The roofline bound of a
            contraction uses the fastest of them (:meth:`as_ceilings`); see :data:`DOT_PRECISIONS`.
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
    dot_precisions: dict = field(default_factory=lambda: dict(DEFAULT_DOT_PRECISIONS))

    def dot_peak(self, precision: str) -> float:
        """FLOP/s of a contraction whose ``tl.dot`` runs at ``precision`` (a :data:`DOT_PRECISIONS`
        name): ``ieee`` on CUDA cores, ``tf32x3`` a third of the TF32 peak (three MMAs per product,
        [TRITON-DOT]), the others at their tensor-core peak.

        Raises:
            KeyError: for an unknown precision name.
        """
        if precision == "ieee":
            return self.vector_flops["f32"]
        if precision == "tf32x3":
            return self.tensor_flops["f32"] / 3.0
        return self.tensor_flops[DOT_PRECISIONS[precision]]

    def contraction_peak(self, operand_dtype: str) -> float:
        """The fastest FLOP/s a contraction over ``operand_dtype`` operands may reach under
        :attr:`dot_precisions` (the tensor-core table where the policy names none)."""
        allowed = self.dot_precisions.get(operand_dtype)
        if not allowed:
            return self.tensor_flops.get(operand_dtype, min(self.vector_flops.values()))
        return max(self.dot_peak(p) for p in allowed)

    def as_ceilings(self) -> dict:
        """The plain-data form the extraction cost model takes (``lumc.rewrites.cost``).

        Its ``tensor_flops`` for the dot dtypes (f32, f16, bf16) are :meth:`contraction_peak`: the
        fastest precision the policy allows, so the bound of an fp32 contraction is the 3xTF32 rate
        its default code reaches, not the plain TF32 peak.
        """
        tensor = dict(self.tensor_flops)
        for d in self.dot_precisions:
            tensor[d] = self.contraction_peak(d)
        return {"name": self.name, "tensor_flops": tensor,
                "vector_flops": dict(self.vector_flops), "bandwidth": self.hbm_bandwidth,
                "launch_s": self.launch_overhead_s}


# Operand precisions of ``tl.dot`` and the tensor-core table entry each one's peak reads (``ieee``
# and ``tf32x3`` are derived, see DeviceSpec.dot_peak). ``fp8`` is e4m3 with scales.
DOT_PRECISIONS = {"ieee": "f32", "tf32x3": "f32", "tf32": "f32", "bf16": "bf16", "fp16": "f16",
                  "fp8": "f8"}
# What an fp32-class compile may use per operand dtype: split TF32 on tensor cores (about fp32
# accuracy) or IEEE FFMA (the faster one for tiny K); fp16/bf16 operands multiply natively.
DEFAULT_DOT_PRECISIONS = {"f32": ("tf32x3", "ieee"), "bf16": ("bf16",), "f16": ("fp16",)}

_HOPPER_TENSOR = {"f64": 66.9 * TERA, "f32": 494.7 * TERA, "f16": 989.4 * TERA,
                  "bf16": 989.4 * TERA, "f8": 1978.9 * TERA, "i8": 1978.9 * TERA,
                  "u8": 1978.9 * TERA}
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
