"""Drive health: nvme-cli SMART JSON pairs (in nvme-cli's json_smart_log layout) parsed and
judged by the rig profile's [health] criteria; targets without a SMART log say why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qual.judge import judge
from qual.targets import Target
from qual.workloads import registry
from qual.thresholds import load_profile
from qual.workloads.health import (DATA_UNIT, Snapshot, measurements, ocp_throttling,
                                   unavailable, warning_bits)

SMART = Path(__file__).resolve().parent / "data" / "smart"
WCTEMP_K = 343  # a drive's id-ctrl wctemp: 70 °C


def snapshot(name: str) -> Snapshot:
    return Snapshot.from_json(json.loads((SMART / f"{name}.json").read_text()))


def verdicts(after: str, family: str = "integrity") -> dict[str, bool]:
    """Metric -> passed, for the gen5-tlc profile's health criteria over healthy-before ->
    `after` during `family`."""
    profile = load_profile("gen5-tlc", registry())
    out = {}
    judged = judge(measurements(family, snapshot("healthy-before"), snapshot(after), target="t",
                                wctemp_k=WCTEMP_K, kernel_written=33555 * DATA_UNIT), profile)
    for v in judged.verdicts:
        out[v.criterion.metric] = out.get(v.criterion.metric, True) and v.passed
    return out


def by_metric(after: str) -> dict:
    return {m.metric: m for m in measurements(
        "bandwidth", snapshot("healthy-before"), snapshot(after), target="t", wctemp_k=WCTEMP_K,
        kernel_written=16 << 30)}


def test_a_healthy_pair_passes_every_criterion():
    assert verdicts("healthy-after") == {
        "health_critical_warning": True, "health_media_errors": True,
        "health_temperature_headroom": True, "health_spare_headroom": True,
        "health_thermal_transitions": True, "health_written_unaccounted": True}


@pytest.mark.parametrize("profile", ["ci", "nvme-rig"])
def test_a_critical_warning_fails_in_every_profile_naming_its_bits(profile):
    """The drive's own statement that it is failing is judged where no profile says so: ci
    has no [health] table and nvme-rig no critical warning criterion; the verdict names the bit
    and the threshold the temperature crossed."""
    after = snapshot("healthy-after")
    after = Snapshot(**{**after.__dict__, "critical_warning": 0b10, "temperature_k": 323})
    found = measurements("bandwidth", snapshot("healthy-before"), after, target="t",
                         wctemp_k=WCTEMP_K, kernel_written=None, threshold_k=300)
    judged = judge(found, load_profile(profile, registry()))
    (failing,) = judged.failing
    assert failing.startswith("health_critical_warning[family=bandwidth] = 2 > max 0")
    assert "[qual: the drive says it is failing: critical warning bit 1 (temperature outside " \
        "a threshold (over- or under-temperature): composite 323 K, over-temperature " \
        "threshold 300 K" in failing
    assert warning_bits(0b1001) == ("bit 0 (available spare below its threshold), bit 3 "
                                    "(media placed in read-only mode)")


def test_a_profiles_own_criterion_replaces_the_standing_one(tmp_path):
    own = tmp_path / "own.toml"
    own.write_text('[profile]\ndescription = "d"\n[health]\n[[health.criteria]]\n'
                   'metric = "health_critical_warning"\nparams = { family = "gnn" }\nmax = 4\n'
                   'unit = "count"\nsource = "a lab that tolerates bit 2"\n')
    after = Snapshot(**{**snapshot("healthy-after").__dict__, "critical_warning": 4})
    judged = judge(measurements("gnn", snapshot("healthy-before"), after, target="t",
                                wctemp_k=WCTEMP_K, kernel_written=None),
                   load_profile(own, registry()))
    assert not judged.failing and len(judged.verdicts) == 1
    assert judged.verdicts[0].criterion.source == "a lab that tolerates bit 2"


@pytest.mark.parametrize("kernel_units, passes", [
    (33555, True), (33555.9, True), (33554.1, True),  # within one unit of rounding
    (33553.9, False), (33556.1, False)])
def test_the_drives_count_of_written_bytes_must_agree_with_the_kernels(kernel_units, passes):
    found = {m.metric: m for m in measurements(
        "pts", snapshot("healthy-before"), snapshot("healthy-after"), target="t",
        wctemp_k=WCTEMP_K, kernel_written=int(kernel_units * DATA_UNIT))}
    m = found["health_written_unaccounted"]
    judged = judge([m], load_profile("ci", registry()))
    assert bool(judged.failing) is not passes, judged.lines()
    assert "the drive counted 17,180,160,000 B written (33555 data units" in \
        judged.verdicts[0].line()


def test_on_a_filesystem_only_a_drive_that_counted_more_than_it_was_sent_fails():
    """ext4 may zero blocks with Write Zeroes, which the kernel counts as written and a drive
    need not: on qual's filesystem, only the drive's count above the kernel's is judged."""
    def judged(kernel_units):
        found = {m.metric: m for m in measurements(
            "checkpoint", snapshot("healthy-before"), snapshot("healthy-after"), target="t",
            wctemp_k=WCTEMP_K, kernel_written=int(kernel_units * DATA_UNIT), raw=False)}
        return judge([found["health_written_unaccounted"]], load_profile("ci", registry()))
    assert not judged(40_000).failing  # the kernel counted zeroes the drive did not
    assert judged(33553.9).failing  # the drive counted more than it was sent
    assert "Write Zeroes count for the kernel alone" in judged(40_000).lines()[0]


def test_writes_the_drive_failed_are_not_counted_against_it():
    """The kernel counts a failed write as sent; the drive counts nothing written."""
    failed = 10 * DATA_UNIT
    found = {m.metric: m for m in measurements(
        "pts", snapshot("healthy-before"), snapshot("healthy-after"), target="t",
        wctemp_k=WCTEMP_K, kernel_written=33555 * DATA_UNIT + failed, failed_writes=failed)}
    judged = judge([found["health_written_unaccounted"]], load_profile("ci", registry()))
    assert not judged.failing and "less 5,120,000 B of writes it failed" in judged.lines()[0]
    found = {m.metric: m for m in measurements(
        "pts", snapshot("healthy-before"), snapshot("healthy-after"), target="t",
        wctemp_k=WCTEMP_K, kernel_written=33555 * DATA_UNIT + failed)}
    assert judge([found["health_written_unaccounted"]], load_profile("ci", registry())).failing


def test_new_thermal_management_transitions_fail():
    v = verdicts("throttled-after")
    assert v["health_thermal_transitions"] is False and v["health_temperature_headroom"] is True
    assert by_metric("throttled-after")["health_thermal_transitions"].value == 3


def test_the_hottest_sample_through_the_run_counts_not_only_the_ends():
    """Both ends are cool; a sample in between went past WCTEMP: the headroom is negative."""
    trace = [{"t_s": 2.0, "temperature_k": 330, "read_bytes": 0, "write_bytes": 0},
             {"t_s": 4.0, "temperature_k": WCTEMP_K + 4, "read_bytes": 0, "write_bytes": 1 << 30},
             {"t_s": 6.0, "temperature_k": 325, "read_bytes": 0, "write_bytes": 2 << 30}]
    found = {m.metric: m for m in measurements(
        "pts", snapshot("healthy-before"), snapshot("healthy-after"), target="t",
        wctemp_k=WCTEMP_K, kernel_written=None, trace=trace)}
    assert found["health_temperature_headroom"].value == -4
    assert found["health_temperature_headroom"].context["temperature_trace"] == trace
    from qual.workloads.health import temperature_chart
    assert temperature_chart(trace, WCTEMP_K, "t").startswith(b"\x89PNG")


def test_the_ocp_plugins_throttling_counters_are_read_and_counted():
    doc = json.loads((SMART / "ocp-smart-add-log.json").read_text())
    assert ocp_throttling(doc) == (2, 1)
    lower = {k.lower(): v for k, v in doc.items()}  # newer nvme-cli spells keys in lower case
    assert ocp_throttling(lower) == (2, 1)
    found = {m.metric: m for m in measurements(
        "pts", snapshot("healthy-before"), snapshot("healthy-after"), target="t",
        wctemp_k=WCTEMP_K, kernel_written=None, ocp=((0, 0), (2, 1)))}
    assert found["health_thermal_transitions"].value == 2
    assert found["health_thermal_transitions"].context["ocp_throttling"]["status_after"] == 1
    with pytest.raises(ValueError, match="Current throttling status"):
        ocp_throttling({"Number of Thermal throttling events": 0})


def test_a_healthy_pair_records_what_changed():
    m = by_metric("healthy-after")
    assert m["health_error_log_entries"].value == 2  # recorded, not judged
    assert m["health_host_written"].value == 33555 * DATA_UNIT
    assert m["health_host_written"].context["kernel_written_bytes"] == 16 << 30
    assert m["health_temperature_headroom"].value == WCTEMP_K - 322  # the hotter reading
    assert m["health_spare_headroom"].value == pytest.approx(0.90)


def test_new_media_errors_fail():
    v = verdicts("media-errors-after")
    assert v["health_media_errors"] is False and v["health_critical_warning"] is True
    assert by_metric("media-errors-after")["health_media_errors"].value == 3


def test_a_critical_warning_fails_in_either_json_form():
    assert verdicts("critical-warning-after")["health_critical_warning"] is False
    m = by_metric("critical-warning-after")["health_critical_warning"]
    assert m.value == 4 and m.context["critical_warning_changed"]


def test_a_drive_above_its_warning_temperature_fails():
    v = verdicts("hot-after")
    assert v["health_temperature_headroom"] is False and v["health_critical_warning"] is False
    assert by_metric("hot-after")["health_temperature_headroom"].value == WCTEMP_K - 357


def test_spare_below_its_threshold_fails():
    v = verdicts("spare-low-after")
    assert v["health_spare_headroom"] is False
    assert by_metric("spare-low-after")["health_spare_headroom"].value == pytest.approx(-0.02)


def test_without_a_wctemp_the_autoval_bound_applies():
    (m,) = [x for x in measurements("gnn", snapshot("healthy-before"), snapshot("healthy-after"),
                                    target="t", wctemp_k=None, kernel_written=None)
            if x.metric == "health_temperature_headroom"]
    assert m.value == 348 - 322 and m.context["wctemp_source"] == "AutoVal 348 K"


@pytest.mark.parametrize("doc, field", [
    ({"temperature": 300}, "critical_warning"),
    ({"critical_warning": "high"}, "critical_warning"),
    ({"critical_warning": {"value": None}}, "critical_warning"),
])
def test_malformed_smart_json_names_the_field(doc, field):
    good = json.loads((SMART / "healthy-before.json").read_text())
    broken = {**good, **doc}
    if "critical_warning" not in doc:
        del broken["critical_warning"]
    with pytest.raises(ValueError, match=field):
        Snapshot.from_json(broken)


def test_a_file_on_a_virtual_disk_has_no_smart_log(tmp_path):
    reason = unavailable(Target(tmp_path).identity)
    assert reason and "not an NVMe device" in reason


@pytest.mark.slow
def test_suites_skip_health_with_the_reason_off_nvme(tmp_path):
    from testbed import run_suite

    proc, _ = run_suite(tmp_path, "-rs", "-k", "health or seq_read")
    assert proc.returncode == 0, proc.stdout[-2000:]  # a subset: the latency is not selected
    assert "no SMART health log: not an NVMe device" in proc.stdout
