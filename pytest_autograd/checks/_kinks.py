"""Kinks: points where the left and right derivatives differ (relu/clamp/abs at a bound, max with ties).

Central differences average the two slopes there (0.5 for a clamp at its
bound) and second differences blow up like 1/eps, while a correct backward
returns one of the slopes or a value between them (a subgradient). An
element is a kink when the analytical value disagrees with the central
difference but lies between the one-sided differences, and those differ:
it is noted, never failed. A wrong derivative away from kinks still fails.
"""

from dataclasses import dataclass, field

import torch

from pytest_autograd.results.compare import fmt


def kink_mask(central, right, left, analytical, atol, rtol):
    """Elements whose mismatch with ``central`` is explained by differing one-sided derivatives."""
    tolerance = atol + rtol * central.abs()
    mismatch = (central - analytical).abs() > tolerance
    finite = right.isfinite() & left.isfinite() & analytical.isfinite()
    differ = (right - left).abs() > tolerance
    low = torch.minimum(right, left) - tolerance
    high = torch.maximum(right, left) + tolerance
    return mismatch & finite & differ & (analytical >= low) & (analytical <= high)


def jump_mask(right, left, right_half, left_half, tolerance):
    """Elements where a one-sided difference grows like 1/eps when the step halves.

    There ``fn`` itself jumps (a second derivative at a clamp bound, a norm's
    gradient at zero, max's gradient at a tie): no derivative exists to
    compare against.
    """
    def grows(full, half):
        return full.isfinite() & half.isfinite() & (full.abs() > tolerance) & (half.abs() > 1.5 * full.abs())

    return grows(right, right_half) | grows(left, left_half)


@dataclass
class KinkNotes:
    """What was noted instead of failed, for the item's report."""

    lines: list = field(default_factory=list)
    probe_kinks: int = 0  # random probes judged by their one-sided differences (they crossed kinks or ties)
    blurred: bool = False  # a probe passed within a tolerance a wrong gradient could pass too (its noise is large)

    def flush(self, context):
        """Hand the lines noted so far to the check's context (the item's notes), and start afresh."""
        for line in self.lines:
            context.note(line)
        self.lines.clear()

    def add(self, count, example, left, right, analytical):
        self.lines.append(
            f"{count} element(s) at kinks (left and right derivatives differ; the analytical value lies between "
            f"them), e.g. {example}: left {fmt(left)}, right {fmt(right)}, analytical {fmt(analytical)}; "
            "noted, not failed"
        )

    def add_jump(self, count, example, left, right, analytical):
        self.lines.append(
            f"{count} element(s) where the differentiated function jumps (one-sided differences grow like 1/eps), "
            f"e.g. {example}: left {fmt(left)}, right {fmt(right)}, analytical {fmt(analytical)}; no derivative to "
            "compare against; noted, not failed"
        )

    def add_ties(self, ties, failure):
        self.lines.append(
            f"{ties}: at a tie a selection (top-k, sort, max, median, argmax) flips, so finite differences measure "
            f"another selection than backward differentiates ({failure}); judged instead along every tie group "
            "moved together and at a tie-free point (ties moved apart by less than half the gap to other values), "
            "where the derivatives agree; noted, not failed"
        )

    def add_probe(self, argument_names, left, right, analytical):
        self.probe_kinks += 1
        self.lines.append(
            f"a random direction over {argument_names} crosses kinks (left {fmt(left)}, right {fmt(right)}, "
            f"analytical {fmt(analytical)} between them); judged by its one-sided differences; noted, not failed"
        )

    def add_domain_step(self, moving, step, finer):
        self.lines.append(
            f"a step of {fmt(step)} {moving} leaves the op's domain (its "
            f"outputs turn inf/NaN: elements nearer than the step to where the op stops being finite, as sqrt or log "
            f"near 0); judged with a step of {fmt(finer)} instead; noted, not failed"
        )

    def add_domain_edges(self, count, examples, step):
        self.lines.append(
            f"{count} element(s) within {fmt(step)} of where the op stops being finite (a step that small still "
            f"leaves its domain), e.g. {examples}: their derivatives not judged; every other element judged"
        )
