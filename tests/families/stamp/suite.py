"""The stamp family's suite: its tests are the family's own (TESTS, each a section of one
shared run, made by the plugin), judged against the profile."""

import pytest

pytestmark = [pytest.mark.stamp]
