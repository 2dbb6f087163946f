"""Can a drive of the profile's class meet its criteria at all? A bound no drive of the class
can reach fails every drive and qualifies none: the checks here catch such a bound before a
run, from the profile alone.

- No bandwidth floor exceeds what the class's host link carries (`[profile] link`).
- AU floors: AU x accelerators x one accelerator's demand must fit within the link.
- Read-bandwidth floors stay within the class's published peak at their block size
  (`[profile] peak_read_bw`); at a block size with no published figure, strictly below the
  peak published for a larger one (smaller blocks cannot be assumed to reach it).
- Dataset shares (MLPerf Storage's size rule) must be reachable with the profile's own dataset:
  500 steps of every accelerator in files (the host-memory half of the rule depends on the
  host and is measured at run time).
"""

from __future__ import annotations

from qual import units
from qual.honesty import link_ceiling
from qual.target import Identity
from qual.thresholds import LINK, Profile

READ_BW = ("seq_read_bw", "rand_read_bw")


def link_bandwidth(link: str | None) -> float | None:
    """Payload bytes/s of a profile's `link` ("32 GT/s x4"), None without one."""
    m = LINK.match(link or "")
    if not m:
        return None
    return link_ceiling(Identity(transport="nvme", link_speed=f"{m.group(1)} GT/s",
                                 link_width=m.group(2)))


def problems(profile: Profile) -> list[str]:
    """Every criterion of the profile no drive of its class can meet, with the arithmetic."""
    out = []
    link = link_bandwidth(profile.link)
    gbs = lambda v: f"{v / 1e9:.3g} GB/s"  # noqa: E731
    for c in profile.criteria:
        if c.min is None:
            continue
        where = f"{c.id} [{c.file}]"
        params = c.param_dict
        if link and units.parse_unit(c.unit).dimension == "bandwidth" and c.min > link:
            out.append(f"{where}: at least {gbs(c.min)}, more than a {profile.link} link "
                       f"carries ({gbs(link)})")
        if c.metric in READ_BW and profile.peak_read_bw:
            out += _above_peak(profile, c.min, params["bs"], where)
        if c.metric == "train_au" and link:
            demand = _demand(profile)
            n = params["accelerators"]
            if demand and c.min * n * demand > link:
                out.append(f"{where}: AU {c.min * 100:g} % x {n} accelerators x "
                           f"{gbs(demand)} each needs {gbs(c.min * n * demand)}, more than a "
                           f"{profile.link} link carries ({gbs(link)})")
        if c.metric == "train_dataset_share":
            share = _reachable_share(profile, params["accelerators"])
            if share < c.min:
                out.append(f"{where}: at least {c.min * 100:g} % of MLPerf's dataset size, but "
                           f"the profile's dataset holds {share * 100:.3g} % of 500 steps of "
                           f"{params['accelerators']} accelerators")
    return out


def _above_peak(profile: Profile, floor: float, block: str, where: str) -> list[str]:
    bs = units.parse_size(block, name="bs")
    peaks = profile.peak_read_bw
    fmt = lambda v: units.format_quantity(v, "GiB/s")  # noqa: E731
    if bs in peaks:
        if floor > peaks[bs]:
            return [f"{where}: at least {fmt(floor)}, above the class's published "
                    f"{fmt(peaks[bs])} at {units.format_size(bs)}"]
        return []
    larger = [v for b, v in peaks.items() if b > bs]
    if larger and floor >= max(larger):
        return [f"{where}: at least {fmt(floor)} at {units.format_size(bs)}, where nothing is "
                f"published; the class peaks at {fmt(max(larger))} with larger blocks"]
    return []


def _demand(profile: Profile) -> float | None:
    from qual.workloads.training import workload_of

    table = profile.table("training")
    if table is None:
        return None
    w = workload_of(table)
    return w.demand() if w.computation_time else None


def _reachable_share(profile: Profile, accelerators: int) -> float:
    from qual.workloads.training import configs, workload_of

    w = workload_of(profile.table("training"))
    return w.files / configs.minimum_files(w, accelerators, host_memory=0)
