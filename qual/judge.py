"""Measurements x profile x baseline -> verdicts: the one place a number becomes a pass or a
fail, used by the pytest plugin and the `qual <family> --profile` command alike. A criterion on
a measurement that claims the device but lacks the device's own counters is UNVERIFIED, not
judged, unless the profile says `device_truth = "optional"` (then it carries a caveat); one that
says why it cannot be a verdict (`unverifiable`: an mmap baseline not held to its memory) is
UNVERIFIED whatever the profile says. A verdict on a measurement whose confidence interval holds
the bound says so. The judge reads a measurement's typed fields (qual.measurement.Measurement), never
a family's context keys."""

from __future__ import annotations

import dataclasses

from qual import units
from qual.honesty import unproven
from qual.measurement import Judgement, Measurement, Verdict
from qual.record import Baseline
from qual.thresholds import Profile


def _straddles(v: Verdict, m: Measurement) -> tuple[str, ...]:
    """A measurement with a confidence interval that holds the bound: the verdict stands on the
    median (or mean), and says that the run cannot tell which side the true value lies on."""
    if not m.spread_from:
        return ()
    interval = m.interval
    if interval is None:
        return ("its spread is unknown (one sample): the run cannot say how sure the verdict is",)
    if not interval[0] < v.limit < interval[1]:
        return ()
    unit = v.criterion.unit
    share = m.interval_confidence
    return (f"the {share * 100:.3g} % interval {units.format_quantity(interval[0], unit)} .. "
            f"{units.format_quantity(interval[1], unit)} straddles the bound "
            f"{units.format_quantity(v.limit, unit)}: this run cannot tell which side the "
            "true value lies on (more samples narrow it)",)


def judge(measurements: list[Measurement], profile: Profile,
          baseline: Baseline | None = None) -> Judgement:
    """Judge every measurement against the profile's criteria for it (where it states none, the
    family's standing criterion for it, if any) and, with a baseline,
    against the same measurement of the baseline run within the criterion's tolerance."""
    out = Judgement()
    for m in measurements:
        criteria = profile.criteria_for(m.id) or ([m.standing] if m.standing else [])
        out.severities += [c.severity for c in criteria]
        if criteria and not m.resolved:
            out.unresolved.append(f"{m.id} {m.unresolved or 'is not resolved'}: lengthen "
                                  "the run")
            continue
        ceiling = m.ceiling  # the most the measuring setup itself can show
        caveats = tuple(m.caveats)
        if criteria and m.unverifiable:  # no profile setting can excuse these
            out.unverified += [f"{c.id}: not judged, {m.unverifiable}" for c in criteria]
            continue
        missing = unproven(m.device_truth)
        if criteria and missing:
            if profile.device_truth != "optional":
                out.unverified += [f"{c.id}: not judged, device truth {missing}; the profile "
                                   "needs the device's own counters (device_truth = "
                                   "\"optional\" judges without them)" for c in criteria]
                continue
            caveats += (f"no device truth ({missing}): judged without proof that the device "
                        "served it",)
        for c in criteria:
            if ceiling is not None and c.min is not None and c.min > ceiling:
                out.unresolved.append(
                    f"{c.id}: the profile asks for at least {units.format_quantity(c.min, c.unit)}"
                    f" but the simulation reaches only {units.format_quantity(ceiling, c.unit)} "
                    f"with no storage at all, so it cannot judge the drive [{c.file}]")
                continue
            for v in c.judge(m.value):
                straddle = _straddles(v, m)
                out.verdicts.append(dataclasses.replace(
                    v, caveats=caveats + straddle, inconclusive=bool(
                        straddle and not v.passed and profile.straddle == "inconclusive"
                        and m.interval)))
        if baseline:
            tolerance = next((c.tolerance for c in criteria if c.tolerance is not None),
                             profile.tolerance)
            r = baseline.compare(m, tolerance)
            if r:
                out.regressions.append(r)
    return out
