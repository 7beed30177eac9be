"""The roofline picture of a compiled model (``lumc inspect ART --plot r.png``).

Left: every kernel at (arithmetic intensity in FLOP/byte, achieved FLOP/s = FLOPs / time) on log
axes, under the device's ceilings: the HBM line ``bandwidth x intensity`` and the compute peaks of
the kernels' dtypes (tensor-core and CUDA-core, from ``lumc.backends.devices``). Colour and marker
say the kernel form; a number is the kernel's launch index. A kernel on a ceiling runs at its bound;
the vertical gap below is what is left to win. Kernels with no FLOPs (gathers, copies) have no place
on this chart; the right panel shows them with the rest: the kernels taking the most time, each
bar its time with a tick at its roofline bound.

The title says whether the times are simulated or measured. Rendering uses matplotlib's Agg backend
(no display needed).
"""
from __future__ import annotations

import math
from lumc.backends.devices import DeviceSpec

MARKERS = "osD^v<>pPX*h"
TOP_BARS = 16        # kernels shown in the time panel
MAX_LABELS = 16      # labelled spots on the roofline (the ones taking the most time)


def _label_groups(points, tol: float = 0.12):
    """Merge the labels of kernels drawn within ``tol`` decades of each other (repeated layers,
    near twins) into one: ``#3,#9`` or ``#3 +5 more``."""
    groups: list[list] = []
    for x, y, i in sorted(points, key=lambda p: p[2]):
        lx, ly = math.log10(x), math.log10(y)
        for g in groups:
            if abs(g[0] - lx) <= tol and abs(g[1] - ly) <= tol:
                g[2].append(i)
                break
        else:
            groups.append([lx, ly, [i], x, y])
    out = []
    for _, _, idx, x, y in groups:
        if len(idx) <= 2:
            text = ",".join(f"#{i}" for i in idx)
        else:
            text = f"#{idx[0]},#{idx[1]} +{len(idx) - 2} more"
        out.append((x, y, text, idx))
    return out


def _place_labels(ax, labels, points, obstacles=(), fontsize: float = 8.0) -> None:
    """Put each label at the offset (right, left, above, below its point) that covers the fewest
    markers, texts in ``obstacles`` and labels already placed, so crowded kernels stay readable."""
    fig = ax.figure
    fig.canvas.draw()   # fixes the data -> pixel transform
    scale = fig.dpi / 72.0
    to_px = ax.transData.transform
    marks = [tuple(to_px((x, y))) for x, y in points]
    renderer = fig.canvas.get_renderer()
    placed: list[tuple[float, float, float, float]] = [tuple(t.get_window_extent(renderer).extents)
                                                       for t in obstacles]
    char_w, h = 0.62 * fontsize * scale, 1.3 * fontsize * scale
    for x, y, text in labels:
        px, py = to_px((x, y))
        w = char_w * len(text)
        best = None
        for dx, dy in ((7, 4), (7, -14), (-7 - w / scale, 4), (-7 - w / scale, -14), (-w / 2 / scale, 9),
                       (-w / 2 / scale, -20)):
            x0, y0 = px + dx * scale, py + dy * scale
            box = (x0, y0, x0 + w, y0 + h)
            hits = sum(box[0] - 6 <= mx <= box[2] + 6 and box[1] - 6 <= my <= box[3] + 6
                       for mx, my in marks if (mx, my) != (px, py))
            hits += 2 * sum(not (box[2] < b[0] or b[2] < box[0] or box[3] < b[1] or b[3] < box[1])
                            for b in placed)
            if best is None or hits < best[0]:
                best = (hits, dx, dy, box)
        _, dx, dy, box = best
        placed.append(box)
        ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                    zorder=4, bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.7))


def plot_roofline(rows: list[dict], spec: DeviceSpec, path, *, title: str, simulated: bool,
                  dtypes: set[str] | None = None) -> str:
    """Draw the chart to ``path`` (PNG); returns the path.

    Args:
        rows: per-kernel dicts with ``index``, ``form``, ``flops``, ``bytes``, ``time_s`` (seconds)
            and ``bound_s`` (the compile report's ``per_kernel`` or a bench's ``kernels``).
        spec: the device whose ceilings are drawn.
        title: the first title line (model and device); the second says simulated or measured.
        dtypes: dtype names whose compute peaks to draw (default ``{"f32"}``).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = dtypes or {"f32"}
    timed = [r for r in rows if r.get("time_s")]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(15, 7.2), gridspec_kw={"width_ratios": [1.55, 1]})
    forms = sorted({r["form"] for r in rows})
    cmap = plt.get_cmap("tab10")
    style = {f: (cmap(i % 10), MARKERS[i % len(MARKERS)]) for i, f in enumerate(forms)}

    # ---- roofline panel ----
    pts = [(r["flops"] / r["bytes"], r["flops"] / r["time_s"], r) for r in timed
           if r["flops"] > 0 and r["bytes"] > 0]
    bw = spec.hbm_bandwidth
    peaks = []
    for d in sorted(dtypes):
        if d in spec.tensor_flops:
            name = "TF32" if d == "f32" else d.upper()
            peaks.append((spec.tensor_flops[d], f"{name} tensor core {spec.tensor_flops[d] / 1e12:.0f} TFLOP/s"))
        if d in spec.vector_flops:
            peaks.append((spec.vector_flops[d], f"{d.upper()} CUDA core {spec.vector_flops[d] / 1e12:.1f} TFLOP/s"))
    top = max(p for p, _ in peaks)
    xs = [p[0] for p in pts] or [1.0]
    ys = [p[1] for p in pts] or [top / 1e3]
    xmin = min(min(xs) / 3, 0.05)
    xmax = max(max(xs) * 3, top / bw * 4)
    ymin = min(min(ys) / 3, bw * xmin)
    ymax = top * 3
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(xmin, xmax)
    ax.set_ylim(ymin, ymax)
    ridge = top / bw
    ax.plot([xmin, ridge], [bw * xmin, top], color="black", lw=2)
    lx = xmin * 2.0   # above the memory line: no kernel can be there
    hbm_label = ax.text(lx, bw * lx * 1.5, f"HBM {bw / 1e12:.2f} TB/s", fontsize=10, va="bottom",
                        ha="left", rotation_mode="anchor")
    ceiling_labels = [hbm_label]
    for peak, label in peaks:
        r_x = peak / bw
        ax.plot([r_x, xmax], [peak, peak], color="black", lw=2 if peak == top else 1.3,
                ls="-" if peak == top else "--")
        ceiling_labels.append(ax.text(xmax / 1.1, peak * 1.12, label, ha="right", va="bottom",
                                      fontsize=9.5))
    for f in forms:
        fp = [(x, y) for x, y, r in pts if r["form"] == f]
        if fp:
            c, m = style[f]
            ax.scatter([p[0] for p in fp], [p[1] for p in fp], s=70, color=c, marker=m,
                       edgecolor="black", lw=0.6, label=f"{f} ({len(fp)})", zorder=3)
    zero = [r for r in rows if r["flops"] == 0]
    if zero:
        ax.text(0.99, 0.02, f"not drawn: {len(zero)} kernel(s) with no FLOPs (data movement)",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=9, color="dimgray")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of minimum traffic)")
    ax.set_ylabel("achieved FLOP/s")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.08)
    if pts:
        ax.legend(title="kernel form (count)", loc="upper left", fontsize=9, title_fontsize=9,
                  framealpha=0.9)
    ax.set_title("roofline", fontsize=11)

    # ---- time panel ----
    ranked = sorted(timed, key=lambda r: -r["time_s"])[:TOP_BARS]
    total = sum(r["time_s"] for r in timed) or 1.0
    labels = [f"#{r.get('index', 0)} {r['form']}" for r in ranked]
    ypos = list(range(len(ranked)))[::-1]
    bx.barh(ypos, [r["time_s"] * 1e6 for r in ranked], color=[style[r["form"]][0] for r in ranked],
            edgecolor="black", lw=0.5, height=0.7)
    bx.scatter([r["bound_s"] * 1e6 for r in ranked], ypos, marker="|", s=260, color="black",
               zorder=3, label="roofline bound")
    for y, r in zip(ypos, ranked):
        bx.text(r["time_s"] * 1e6, y, f" {100 * r['time_s'] / total:.0f}%", va="center", fontsize=8)
    if ranked:   # every launch pays this before any work: the floor of a small kernel's time
        lo = spec.launch_overhead_s * 1e6
        bx.axvline(lo, color="dimgray", ls=":", lw=1.5, label=f"launch overhead {lo:.1f} us")
    bx.set_yticks(ypos)
    bx.set_yticklabels(labels, fontsize=9)
    bx.set_xlabel("time per launch (us)")
    more = f" (top {len(ranked)} of {len(timed)})" if len(timed) > len(ranked) else ""
    bx.set_title(f"where the time goes{more}; % = share of the total", fontsize=11)
    bx.grid(True, axis="x", alpha=0.3)
    if ranked:
        bx.set_xlim(0, max(r["time_s"] for r in ranked) * 1e6 * 1.18)
        bx.legend(loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2, fontsize=9, frameon=False)
    kind = "simulated times (analytical model, no GPU)" if simulated else "measured times (CUDA events)"
    fig.suptitle(f"{title}\n{kind}; total {total * 1e6:.1f} us over {len(timed)} timed kernels",
                 fontsize=12.5)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    p1, p2 = ax.transData.transform([(lx, bw * lx), (lx * 10, bw * lx * 10)])
    hbm_label.set_rotation(math.degrees(math.atan2(p2[1] - p1[1], p2[0] - p1[0])))
    groups = _label_groups([(x, y, r.get("index", 0)) for x, y, r in pts])
    if len(groups) > MAX_LABELS:   # label where the time goes; the rest stay unlabelled dots
        t_of = {r.get("index", 0): r["time_s"] for _, _, r in pts}
        groups = sorted(groups, key=lambda g: -sum(t_of[i] for i in g[3]))[:MAX_LABELS]
        ax.text(0.99, 0.06, f"labelled: the {MAX_LABELS} spots taking the most time",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=9, color="dimgray")
    _place_labels(ax, [g[:3] for g in groups], [(x, y) for x, y, _ in pts], ceiling_labels)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
