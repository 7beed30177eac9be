"""Handlers for neural-network ops: activations, softmax family, normalizations, convolution,
pooling, LRN, and resizing (``Resize``, ``Upsample``).

The numerics live in ``lumc.ir.library`` (activations, norm, conv, pool, resize); this module maps
ONNX attributes and opset-dependent forms onto those functions: legacy 2-D coercion of
``Softmax``/``LogSoftmax``/``Hardmax`` before opset 13, ``BatchNormalization`` training outputs,
``Upsample`` and opset-10 ``Resize`` as asymmetric/floor resizes.
"""
from __future__ import annotations

import numpy as np
import onnx

from lumc.compiler.frontends.onnx_frontend.loader import dtype_of
from lumc.compiler.frontends.onnx_frontend.registry import OpContext, handler, lib, scalar
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor, normalize_axis
from lumc.ir.views import prod


def _attr_of(node: onnx.NodeProto, name: str):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return None


# ---- activations ----------------------------------------------------------------------------------
_ACT = {  # op -> (library function, {onnx attribute: default})
    "Relu": ("relu", {}),
    "LeakyRelu": ("leaky_relu", {"alpha": 0.01}),
    "Elu": ("elu", {"alpha": 1.0}),
    "Selu": ("selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
    "Celu": ("celu", {"alpha": 1.0}),
    "Softplus": ("softplus", {}),
    "Softsign": ("softsign", {}),
    "HardSigmoid": ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
    "HardSwish": ("hard_swish", {}),
    "Mish": ("mish", {}),
    "ThresholdedRelu": ("thresholded_relu", {"alpha": 1.0}),
    "Gelu": ("gelu", {"approximate": "none"}),
}


def _activation(fn_name: str, defaults: dict):
    def build(ctx: OpContext):
        kw = {k: ctx.attr(k, d) for k, d in defaults.items()}
        return lib(f"activations.{fn_name}")(ctx.input(0), **kw)
    return build


for _op, (_fn, _defaults) in _ACT.items():
    handler(_op, requires=[f"activations.{_fn}"])(_activation(_fn, _defaults))


@handler("PRelu", requires=["activations.prelu"])
def _prelu(ctx: OpContext):
    x, slope = ctx.input(0), ctx.input(1)
    if ctx.opset < 7 and slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] != 1:
        # opset 6 exporters give a per-channel slope [C] for [N, C, ...] inputs
        slope = slope.reshape((slope.shape[0],) + (1,) * (x.ndim - 2))
    return lib("activations.prelu")(x, slope)


@handler("Swish", requires=["activations.silu"])
def _swish(ctx: OpContext):
    x = ctx.input(0)
    alpha = ctx.attr("alpha", 1.0)
    if alpha == 1.0:
        return lib("activations.silu")(x)
    return x.mul(x.mul(scalar(alpha, x.dtype)).sigmoid())


# ---- softmax family -------------------------------------------------------------------------------
@handler("Softmax", "LogSoftmax", requires=["norm.softmax", "norm.log_softmax",
                                            "norm.softmax_legacy", "norm.log_softmax_legacy"])
def _softmax(ctx: OpContext):
    name = "softmax" if ctx.node.op_type == "Softmax" else "log_softmax"
    if ctx.opset < 13:
        return lib(f"norm.{name}_legacy")(ctx.input(0), axis=ctx.attr("axis", 1))
    return lib(f"norm.{name}")(ctx.input(0), axis=ctx.attr("axis", -1))


@handler("Hardmax", requires=["reduce.argmax"])
def _hardmax(ctx: OpContext):
    """1 at the first maximum along the axis, 0 elsewhere (2-D coercion before opset 13)."""
    x = ctx.input(0)
    if ctx.opset < 13:
        axis = normalize_axis(ctx.attr("axis", 1), x.ndim) if x.ndim else 0
        flat = x.reshape((prod(x.shape[:axis]), prod(x.shape[axis:])))
        return _hardmax_along(flat, 1).reshape(x.shape)
    return _hardmax_along(x, normalize_axis(ctx.attr("axis", -1), x.ndim))


def _hardmax_along(x: Tensor, axis: int) -> Tensor:
    idx = lib("reduce.argmax")(x, axis=axis, keepdims=True)
    hit = Tensor.iota(x.shape, axis).eq(idx.expand(x.shape))
    return hit.where(x.scalar_like(1), x.scalar_like(0))


# ---- normalizations -------------------------------------------------------------------------------
def _check_batch_norm(node: onnx.NodeProto, opset: int) -> str | None:
    if opset < 9 and _attr_of(node, "spatial") == 0:
        return "spatial=0"
    return None


@handler("BatchNormalization", requires=["norm.batch_norm"], check=_check_batch_norm)
def _batch_norm(ctx: OpContext):
    x, scale, bias, mean, var = (ctx.input(i) for i in range(5))
    eps = ctx.attr("epsilon", 1e-5)
    training = ctx.attr("training_mode", 0) if ctx.opset >= 14 else (
        ctx.opset < 7 and ctx.attr("is_test", 0) == 0) or (7 <= ctx.opset < 14 and ctx.n_outputs > 1)
    if not training:
        return lib("norm.batch_norm")(x, scale, bias, mean, var, epsilon=eps)
    # training mode: normalize with the batch statistics, and update the running ones
    axes = [0] + list(range(2, x.ndim))
    xs = x.cast(dt.f32) if x.dtype in (dt.f16, dt.bf16) else x
    bmean = xs.mean(axes)
    bvar = xs.sub(xs.mean(axes, keepdims=True)).powi(2).mean(axes)
    y = lib("norm.batch_norm")(x, scale, bias, bmean.cast(mean.dtype), bvar.cast(var.dtype),
                               epsilon=eps)
    m = ctx.attr("momentum", 0.9)
    run_mean = mean.mul(scalar(m, mean.dtype)).add(bmean.cast(mean.dtype).mul(scalar(1 - m, mean.dtype)))
    run_var = var.mul(scalar(m, var.dtype)).add(bvar.cast(var.dtype).mul(scalar(1 - m, var.dtype)))
    if ctx.opset >= 14:
        return [y, run_mean, run_var]
    return [y, run_mean, run_var, bmean.cast(mean.dtype), bvar.cast(var.dtype)]


@handler("InstanceNormalization", requires=["norm.instance_norm"])
def _instance_norm(ctx: OpContext):
    return lib("norm.instance_norm")(ctx.input(0), ctx.input(1), ctx.input(2),
                                     epsilon=ctx.attr("epsilon", 1e-5))


@handler("LayerNormalization", requires=["norm.layer_norm"])
def _layer_norm(ctx: OpContext):
    stash = ctx.attr("stash_type", 1)
    return list(lib("norm.layer_norm")(ctx.input(0), ctx.input(1), ctx.opt(2),
                                       axis=ctx.attr("axis", -1), epsilon=ctx.attr("epsilon", 1e-5),
                                       stash_dtype=dtype_of(stash)))


@handler("GroupNormalization", requires=["norm.group_norm"])
def _group_norm(ctx: OpContext):
    return lib("norm.group_norm")(ctx.input(0), ctx.input(1), ctx.input(2),
                                  ctx.attr("num_groups"), epsilon=ctx.attr("epsilon", 1e-5))


@handler("RMSNormalization", requires=["norm.rms_norm"])
def _rms_norm(ctx: OpContext):
    return lib("norm.rms_norm")(ctx.input(0), ctx.input(1), axis=ctx.attr("axis", -1),
                                epsilon=ctx.attr("epsilon", 1e-5))


@handler("LpNormalization", requires=["norm.lp_normalization"])
def _lp_normalization(ctx: OpContext):
    return lib("norm.lp_normalization")(ctx.input(0), axis=ctx.attr("axis", -1),
                                        p=ctx.attr("p", 2))


@handler("MeanVarianceNormalization", requires=["norm.mean_variance_normalization"])
def _mvn(ctx: OpContext):
    return lib("norm.mean_variance_normalization")(ctx.input(0),
                                                   axes=ctx.attr("axes", [0, 2, 3]))


@handler("LRN")
def _lrn(ctx: OpContext):
    """``x / (bias + alpha/size * sum of x² over a window of channels)^beta``; f16/bf16 in f32,
    rounded once (an f16 square passes 65504 from |x| = 256, where the result is finite)."""
    x0 = ctx.input(0)
    x = x0.cast(x0.dtype.accumulator) if x0.dtype.is_float else x0
    size = ctx.attr("size")
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    if x.ndim < 3:
        raise ShapeError(f"LRN needs [N, C, ...], got {x.shape}")
    if not isinstance(size, int) or size < 1:   # size 0 divided alpha by zero
        raise ShapeError(f"size must be a positive integer, got {size!r}")
    pads = [(0, 0)] * x.ndim
    pads[1] = ((size - 1) // 2, size - 1 - (size - 1) // 2)
    sq = x.mul(x).pad(pads).window(1, size).sum(2)
    base = sq.mul(scalar(alpha / size, x.dtype)).add(scalar(bias, x.dtype))
    return x.div(base.pow(scalar(beta, x.dtype))).cast(x0.dtype)


# ---- convolution and pooling ----------------------------------------------------------------------
def _conv_kw(ctx: OpContext) -> dict:
    return dict(strides=ctx.attr("strides"), pads=ctx.attr("pads"), dilations=ctx.attr("dilations"),
                auto_pad=ctx.attr("auto_pad", "NOTSET"))


def _weight(ctx: OpContext) -> Tensor:
    """Conv's and ConvTranspose's weight, checked against a ``kernel_shape`` attribute (onnxruntime
    refuses a mismatch; the weight's shape alone was used, silently)."""
    w = ctx.input(1)
    ks = ctx.attr("kernel_shape")
    if ks is not None and tuple(int(k) for k in ks) != tuple(w.shape[2:]):
        raise ShapeError(f"kernel_shape {list(ks)} does not match the weight's kernel "
                         f"{list(w.shape[2:])} (weight shape {list(w.shape)})")
    return w


@handler("Conv", requires=["conv.conv"])
def _conv(ctx: OpContext):
    return lib("conv.conv")(ctx.input(0), _weight(ctx), ctx.opt(2), group=ctx.attr("group", 1),
                            **_conv_kw(ctx))


@handler("ConvTranspose", requires=["conv.conv_transpose"])
def _conv_transpose(ctx: OpContext):
    return lib("conv.conv_transpose")(ctx.input(0), _weight(ctx), ctx.opt(2),
                                      group=ctx.attr("group", 1),
                                      output_padding=ctx.attr("output_padding"),
                                      output_shape=ctx.attr("output_shape"), **_conv_kw(ctx))


@handler("MaxPool", requires=["pool.max_pool", "pool.max_pool_indices"])
def _max_pool(ctx: OpContext):
    kw = dict(_conv_kw(ctx), ceil_mode=bool(ctx.attr("ceil_mode", 0)))
    if ctx.wants_output(1):
        return list(lib("pool.max_pool_indices")(ctx.input(0), ctx.attr("kernel_shape"),
                                                 storage_order=ctx.attr("storage_order", 0), **kw))
    return lib("pool.max_pool")(ctx.input(0), ctx.attr("kernel_shape"), **kw)


@handler("AveragePool", requires=["pool.avg_pool"])
def _avg_pool(ctx: OpContext):
    return lib("pool.avg_pool")(ctx.input(0), ctx.attr("kernel_shape"),
                                ceil_mode=bool(ctx.attr("ceil_mode", 0)),
                                count_include_pad=bool(ctx.attr("count_include_pad", 0)),
                                **_conv_kw(ctx))


@handler("LpPool", requires=["pool.lp_pool"])
def _lp_pool(ctx: OpContext):
    return lib("pool.lp_pool")(ctx.input(0), ctx.attr("kernel_shape"), int(ctx.attr("p", 2)),
                               ceil_mode=bool(ctx.attr("ceil_mode", 0)), **_conv_kw(ctx))


@handler("GlobalAveragePool", requires=["pool.global_avg_pool"])
def _global_avg_pool(ctx: OpContext):
    return lib("pool.global_avg_pool")(ctx.input(0))


@handler("GlobalMaxPool", requires=["pool.global_max_pool"])
def _global_max_pool(ctx: OpContext):
    return lib("pool.global_max_pool")(ctx.input(0))


@handler("GlobalLpPool", requires=["pool.global_lp_pool"])
def _global_lp_pool(ctx: OpContext):
    return lib("pool.global_lp_pool")(ctx.input(0), int(ctx.attr("p", 2)))


# ---- resizing -------------------------------------------------------------------------------------
def _nonempty(v: np.ndarray | None) -> np.ndarray | None:
    return None if v is None or v.size == 0 else v


@handler("Resize", requires=["resize.resize"])
def _resize(ctx: OpContext):
    x = ctx.input(0)
    if ctx.opset < 11:
        scales = [float(s) for s in ctx.const(1, "scales").reshape(-1)]
        return _legacy_resize(x, scales, ctx.attr("mode", "nearest"))
    roi = _nonempty(ctx.const(1, "roi"))
    scales = _nonempty(ctx.const(2, "scales"))
    sizes = _nonempty(ctx.const(3, "sizes"))
    return lib("resize.resize")(
        x,
        scales=None if scales is None else [float(s) for s in scales.reshape(-1)],
        sizes=None if sizes is None else [int(s) for s in sizes.reshape(-1)],
        mode=ctx.attr("mode", "nearest"),
        coordinate_transformation_mode=ctx.attr("coordinate_transformation_mode", "half_pixel"),
        nearest_mode=ctx.attr("nearest_mode", "round_prefer_floor"),
        cubic_coeff_a=ctx.attr("cubic_coeff_a", -0.75),
        exclude_outside=ctx.attr("exclude_outside", 0),
        extrapolation_value=ctx.attr("extrapolation_value", 0.0),
        roi=None if roi is None else [float(r) for r in roi.reshape(-1)],
        axes=ctx.attr("axes"),
        keep_aspect_ratio_policy=ctx.attr("keep_aspect_ratio_policy", "stretch"),
        antialias=int(ctx.attr("antialias", 0)))


@handler("Upsample", requires=["resize.resize"])
def _upsample(ctx: OpContext):
    x = ctx.input(0)
    scales = ctx.attr("scales") if ctx.opset < 9 else \
        [float(s) for s in ctx.const(1, "scales").reshape(-1)]
    mode = ctx.attr("mode", "nearest")
    return _legacy_resize(x, scales, "linear" if mode == "bilinear" else mode)


def _legacy_resize(x: Tensor, scales: list[float], mode: str) -> Tensor:
    """``Upsample`` and opset-10 ``Resize`` as onnxruntime runs them: asymmetric coordinates;
    nearest rounds down when enlarging an axis and up when shrinking it."""
    resize = lib("resize.resize")
    if mode != "nearest":
        return resize(x, scales=scales, mode=mode, coordinate_transformation_mode="asymmetric")
    y = x
    for shrink in (False, True):
        axes = [a for a, s in enumerate(scales) if s != 1.0 and (s < 1.0) == shrink]
        if axes:
            y = resize(y, scales=[scales[a] for a in axes], axes=axes, mode="nearest",
                       coordinate_transformation_mode="asymmetric",
                       nearest_mode="ceil" if shrink else "floor")
    return y


@handler("SwiGLU")
def _swiglu(ctx: OpContext):
    """``a * sigmoid(alpha a) * b`` (A and B of one shape, no broadcasting)."""
    a, b = ctx.input(0), ctx.input(1)
    if a.shape != b.shape:
        raise ShapeError(f"SwiGLU needs equal shapes, got {a.shape} and {b.shape}")
    alpha = ctx.attr("alpha", 1.0)
    gate = a.mul(scalar(alpha, a.dtype)) if alpha != 1.0 else a
    return a.mul(gate.sigmoid()).mul(b)


@handler("Col2Im")
def _col2im(ctx: OpContext):
    """Sum sliding blocks back into an image: for each kernel offset, its ``[N, C, *blocks]`` slab is
    spread by ``strides`` (zero insertion, a view) and shifted into place (pad/crop), and the slabs
    are added."""
    x = ctx.input(0)
    image = ctx.const_ints(1, "image_shape")
    block = ctx.const_ints(2, "block_shape")
    k = len(image)
    strides = ctx.attr("strides") or [1] * k
    dil = ctx.attr("dilations") or [1] * k
    pads = ctx.attr("pads") or [0] * (2 * k)
    kk = prod(block)
    n, ck, length = x.shape
    if ck % kk:
        raise ShapeError(f"input channels {ck} are not a multiple of the block size {kk}")
    c = ck // kk
    counts = [(image[d] + pads[d] + pads[k + d] - dil[d] * (block[d] - 1) - 1) // strides[d] + 1
              for d in range(k)]
    if prod(counts) != length:
        raise ShapeError(f"{length} blocks do not tile image {image} with block {block}")
    slabs = x.reshape((n, c, kk) + tuple(counts))
    out = None
    for j, offs in enumerate(np.ndindex(*block)):
        y = slabs.slice([j], [j + 1], [2]).squeeze([2])          # [N, C, *counts]
        for d in range(k):
            ax, s = 2 + d, strides[d]
            if s > 1:   # zero insertion: [.., m, ..] -> [.., m * s, ..]
                shp = list(y.shape)
                y = y.unsqueeze([ax + 1]).pad([(0, 0)] * (ax + 1) + [(0, s - 1)]
                                              + [(0, 0)] * (y.ndim - ax - 1))
                shp[ax] *= s
                y = y.reshape(shp)
            start = offs[d] * dil[d] - pads[d]
            pad = [(0, 0)] * y.ndim
            pad[ax] = (start, image[d] - start - y.shape[ax])
            y = y.pad(pad)
        out = y if out is None else out.add(y)
    return out
