"""Training-data ingestion, seed 001's procedure: simulated accelerators read sample files
through the native engine and compute for a fixed time per step, swept over accelerator counts;
AU and bandwidth judged against the profile, the accelerators one drive keeps busy, the
simulator's own AU ceiling, and whether the dataset is big enough to mean anything. Its tests
are the family's (qual.workloads.training.TESTS)."""

import pytest

pytestmark = [pytest.mark.training]
