"""The `ScalingReport` plot: a PNG written atomically (matplotlib, lazily)."""

from __future__ import annotations

import importlib.util
import os
import tempfile
import textwrap

from keras_dist.callbacks._report import PART_LABELS, PARTS, ScalingResult

_COLORS = {"input": "#d62728", "compute": "#2ca02c", "communication": "#1f77b4", "host": "#7f7f7f"}
_MISSING = (
    "ScalingReport(plot_path=...) writes its plot with matplotlib, which is "
    "not installed: pip install matplotlib (or leave plot_path=None)."
)


def check_matplotlib() -> None:
    """Raises ImportError naming the fix when matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ImportError(_MISSING)


def write_plot(result: ScalingResult, path: str) -> str:
    """Draws `result` into the PNG `path` (temp file + rename); returns it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - checked at construction
        raise ImportError(_MISSING) from error

    figure = Figure(figsize=(10, 3.8))
    FigureCanvasAgg(figure)
    times, rates = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})

    left = 0.0
    for part in PARTS:
        width = result.seconds[part] * 1e3
        times.barh([0], [width], left=left, color=_COLORS[part],
                   label=f"{PART_LABELS[part]} {result.fractions[part] * 100:.0f}%")
        left += width
    times.set_yticks([0])
    times.set_yticklabels([f"{result.replicas} replica(s)"])
    times.set_xlabel("ms per step")
    times.set_title(f"Where a step's time goes ({result.backend}, batch {result.global_batch})")
    times.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, fontsize=8, frameon=False)

    labels, values, colors = [], [], []
    if result.reference_samples_per_second:
        labels += ["1 replica", f"ideal x{result.replicas}"]
        values += [result.reference_samples_per_second, result.reference_samples_per_second * result.replicas]
        colors += ["#bbbbbb", "#dddddd"]
    labels.append(f"{result.replicas} replica(s)")
    values.append(result.samples_per_second)
    colors.append("#2ca02c" if not result.speedup or result.speedup >= 1 else "#d62728")
    rates.bar(range(len(values)), values, color=colors)
    rates.set_xticks(range(len(values)))
    rates.set_xticklabels(labels, fontsize=8)
    rates.set_ylabel("samples / s")
    title = "Throughput"
    if result.efficiency is not None:
        title += f": speedup {result.speedup:.2f}x, efficiency {result.efficiency * 100:.0f}%"
    rates.set_title(title, fontsize=10)
    shown = [h.replace(" The hints below say why.", "") for h in result.hints[:2]]
    caption = "\n".join(textwrap.fill("Hint: " + h, width=170) for h in shown)
    if len(result.hints) > len(shown):
        caption += f"\n(+{len(result.hints) - len(shown)} more hint(s) in the printed report)"
    figure.tight_layout(rect=(0, (0.04 * (caption.count("\n") + 1) + 0.02) if shown else 0, 1, 1))
    if shown:
        figure.text(0.01, 0.01, caption, fontsize=7, va="bottom")

    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".scaling_report_", suffix=".png", dir=directory)
    try:
        with os.fdopen(handle, "wb") as file:
            figure.savefig(file, format="png", dpi=100)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as open() would create it
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return path
