"""The workload families qual runs; each owns a table of the profile and a suite file."""

from qual.workloads import bandwidth
from qual.family import Family

FAMILIES: dict[str, Family] = {f.name: f for f in (bandwidth.FAMILY,)}
