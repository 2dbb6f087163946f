"""The workload families qual runs; each owns a table of the profile and a suite file."""

from qual.family import Family
from qual.workloads import bandwidth, checkpoint, gnn, health, integrity, training

FAMILIES: dict[str, Family] = {f.name: f for f in (bandwidth.FAMILY, checkpoint.FAMILY, gnn.FAMILY,
                                                    training.FAMILY, integrity.FAMILY,
                                                    health.FAMILY)}
