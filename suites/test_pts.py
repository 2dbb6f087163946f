"""SNIA PTS-E: each test from a purged (NVMe) and preconditioned region, in rounds until its
tracking variable is steady, reported as the specification's tables and plots, judged against
the profile's [pts] table. Its test is the family's (qual.workloads.pts.TESTS), one for each
PTS test the table names, in its order."""

import pytest

pytestmark = [pytest.mark.pts, pytest.mark.destructive]
