"""What a `ScalingReport` found: numbers, hints and their text (no backend)."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

#: The parts of a training step, in the order they are shown.
PARTS = ("input", "compute", "communication", "host")

PART_LABELS = {
    "input": "waiting for input",
    "compute": "compute",
    "communication": "cross-replica communication",
    "host": "host overhead",
}

#: Below this many examples per replica, fixed per-step costs dominate.
SMALL_PER_REPLICA_BATCH = 32
#: Fractions of the step above which a part gets its own hint.
INPUT_BOUND = 0.25
COMMUNICATION_BOUND = 0.3
HOST_BOUND = 0.3


def available_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class ScalingResult:
    """Where the step time of a `fit` went, and what it means.

    Times are seconds per training step (one global batch), averaged over
    the timed steps (all but the first, which includes compilation).
    ``seconds`` and ``fractions`` split a step into `PARTS`; the fractions
    sum to 1. ``reference_samples_per_second`` is one replica's throughput
    on the per-replica batch (``reference_source``: ``"measured"``,
    ``"given"``, or ``None`` when there is none); ``speedup`` is
    ``samples_per_second`` over it, ``efficiency`` the speedup per replica.

    ```python
    report = keras_dist.callbacks.ScalingReport(verbose=0)
    model.fit(x, y, batch_size=64, epochs=2, callbacks=[report], verbose=0)
    result = report.result
    print(f"{result.fractions['communication']:.0%} communication, {result.efficiency}")
    ```
    """

    backend: str
    replicas: int
    devices: tuple
    cross_device_ops: Optional[str]
    global_batch: int
    per_replica_batch: int
    steps: int
    first_step_seconds: float
    step_seconds: float
    seconds: dict
    fractions: dict
    samples_per_second: float
    communication_estimate_seconds: float
    gradient_bytes: int
    reference_samples_per_second: Optional[float]
    reference_source: Optional[str]
    speedup: Optional[float]
    efficiency: Optional[float]
    cores: int
    hints: tuple
    notes: tuple = ()
    plot_path: Optional[str] = None

    def text(self) -> str:
        """The report as plain text, as `ScalingReport` prints it."""
        ops = f", cross_device_ops={self.cross_device_ops}" if self.cross_device_ops else ""
        lines = [
            f"ScalingReport: {self.replicas} replica(s) on {self.backend} "
            f"({', '.join(self.devices)}{ops})",
            f"  global batch {self.global_batch} ({self.per_replica_batch} per replica), "
            f"{self.steps} timed steps (first step, with compilation: "
            f"{self.first_step_seconds * 1e3:.1f} ms, not counted)",
            f"  step time {self.step_seconds * 1e3:.2f} ms:",
        ]
        for part in PARTS:
            lines.append(
                f"    {PART_LABELS[part]:<28} {self.seconds[part] * 1e3:8.2f} ms "
                f"{self.fractions[part] * 100:5.1f}%"
            )
        lines.append(f"  throughput {self.samples_per_second:,.0f} samples/s")
        if self.reference_samples_per_second:
            lines.append(
                f"  one replica ({self.reference_source}, batch {self.per_replica_batch}): "
                f"{self.reference_samples_per_second:,.0f} samples/s -> speedup "
                f"{self.speedup:.2f}x, efficiency {self.efficiency * 100:.0f}% "
                f"(ideal: {self.replicas}x, 100%)"
            )
        elif self.replicas > 1:
            lines.append("  one replica: not measured (no speedup or efficiency)")
        lines.append(
            "  how: input wait and step time are measured (iterator fetches "
            "and steps timed, waiting for each step's logs); communication is "
            f"estimated ({self.communication_estimate_seconds * 1e3:.2f} ms: a timed "
            f"all-reduce of the {self.gradient_bytes / 1e6:.2f} MB of gradients "
            "through the strategy); compute is the step time minus it; host "
            "overhead is the time between steps."
        )
        for note in self.notes:
            lines.append(f"  note: {note}")
        if self.hints:
            lines.append("  hints:")
            lines.extend(f"  - {hint}" for hint in self.hints)
        else:
            lines.append("  no hints: nothing stands out.")
        if self.plot_path:
            lines.append(f"  plot: {self.plot_path}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def hints_for(
    replicas: int,
    cpu_replicas: int,
    cores: int,
    per_replica_batch: int,
    fractions: dict,
    speedup: Optional[float],
) -> tuple:
    """Plain-language hints, most important first (empty when none apply)."""
    hints = []
    if speedup is not None and replicas > 1 and speedup < 1:
        hints.append(
            f"Distribution costs more than it gives here: {replicas} replicas "
            f"process {speedup:.2f}x the samples per second of one replica. "
            "The hints below say why."
        )
    if cpu_replicas > 1 and cpu_replicas > cores:
        hints.append(
            f"{cpu_replicas} replicas are CPU devices sharing {cores} CPU "
            f"core{'s' if cores != 1 else ''}: they compete for the same cores, "
            "so adding replicas adds no compute here, and these timings say "
            "little about real devices. Simulated CPU devices are for checking "
            "correctness; measure speed on real accelerators, or on a host "
            "with at least one core per replica."
        )
    if replicas > 1 and per_replica_batch < SMALL_PER_REPLICA_BATCH:
        hints.append(
            f"Each replica gets only {per_replica_batch} example"
            f"{'s' if per_replica_batch != 1 else ''} per step: the fixed costs "
            "of a step (summing gradients across replicas, launching the "
            "step) outweigh its compute. Use a global batch of at least "
            f"{SMALL_PER_REPLICA_BATCH * replicas} ({SMALL_PER_REPLICA_BATCH} per "
            "replica) and re-tune the learning rate, or use fewer replicas."
        )
    if fractions["input"] >= INPUT_BOUND:
        hints.append(
            f"{fractions['input'] * 100:.0f}% of each step waits for the next "
            "batch: training is input-bound, and more replicas will not help. "
            "Speed up the input: tf.data with .prefetch(tf.data.AUTOTUNE), "
            ".cache() and map(..., num_parallel_calls=tf.data.AUTOTUNE); a "
            "keras.utils.PyDataset with workers=N; or arrays already in memory."
        )
    if replicas > 1 and fractions["communication"] >= COMMUNICATION_BOUND:
        hints.append(
            f"About {fractions['communication'] * 100:.0f}% of each step sums "
            "gradients across replicas: the model is large for the compute "
            "each replica does. Give each replica a larger batch, or use "
            "fewer replicas."
        )
    if fractions["host"] >= HOST_BOUND:
        hints.append(
            f"{fractions['host'] * 100:.0f}% of each step is host overhead "
            "between steps (Keras' loop, callbacks, the progress bar): run "
            "several steps per call with model.compile(..., "
            "steps_per_execution=16), and use verbose=2 or 0."
        )
    return tuple(hints)
