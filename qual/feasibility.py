"""Can a drive of the profile's class meet its criteria at all? A bound no drive of the class
can reach fails every drive and qualifies none: the checks here catch such a bound before a
run, from the profile alone.

- Here: no bandwidth floor exceeds what the class's host link carries (`[profile] link`).
- Each family says the rest of its own (`Family.feasible`): the bandwidth family's read floors
  against the class's published peaks, the training family's AU floors against the link and
  its dataset shares against MLPerf's size rule.
"""

from __future__ import annotations

from qual import units
from qual.honesty import link_ceiling
from qual.targets import Identity
from qual.thresholds import LINK, Profile


def link_bandwidth(link: str | None) -> float | None:
    """Payload bytes/s of a profile's `link` ("32 GT/s x4"), None without one."""
    m = LINK.match(link or "")
    if not m:
        return None
    return link_ceiling(Identity(transport="nvme", link_speed=f"{m.group(1)} GT/s",
                                 link_width=m.group(2)))


def problems(profile: Profile, families: dict) -> list[str]:
    """Every criterion of the profile no drive of its class can meet, with the arithmetic: a
    bandwidth floor above the class's link here, the rest by the family the criterion is of
    (`Family.feasible`)."""
    out = []
    link = link_bandwidth(profile.link)
    for c in profile.criteria:
        if c.min is None:
            continue
        where = f"{c.id} [{c.file}]"
        if link and units.parse_unit(c.unit).dimension == "bandwidth" and c.min > link:
            out.append(f"{where}: at least {format_gbs(c.min)}, more than a {profile.link} "
                       f"link carries ({format_gbs(link)})")
        family = families.get(c.family)
        if family is not None:
            out += [f"{where}: {why}" for why in family.feasible(profile, c, link)]
    return out


def format_gbs(value: float) -> str:
    return f"{value / 1e9:.3g} GB/s"
