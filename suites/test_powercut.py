"""Power cuts: what a completed flush covered reads back after the drive's power is cut, whole
in its atomic write unit, with nothing outside the written region changed, cycle after cycle.
Its test is the family's (qual.workloads.powercut.TESTS); the verify state lies beside the
drive's run record, so that after a cut that took the host down too, `qual run --resume`
verifies that cut first and carries on. Where nothing can cut the drive's power the test says
so and skips."""

import pytest

pytestmark = [pytest.mark.powercut, pytest.mark.destructive]
