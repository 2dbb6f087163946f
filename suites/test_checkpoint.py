"""Checkpoint qualification, by the profile's procedure: seed 004's passes of LLM checkpoints
that fill the target (the mean seconds per checkpoint of every pass judged against the
profile, the last checkpoint restored and verified bit for bit, and torch.save / torch.load
for comparison), or MLPerf Storage v2.0's runs of writes, cache clear and reads. Its tests are
the family's (qual.workloads.checkpoint.TESTS)."""

import pytest

pytestmark = [pytest.mark.checkpoint, pytest.mark.destructive]
