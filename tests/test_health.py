"""Drive health: nvme-cli SMART JSON pairs (in nvme-cli's json_smart_log layout) parsed and
judged by the rig profile's [health] criteria; targets without a SMART log say why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qual.targets import Target
from qual.workloads import registry
from qual.thresholds import load_profile
from qual.workloads.health import DATA_UNIT, Snapshot, measurements, ocp_throttling, unavailable

SMART = Path(__file__).resolve().parent / "data" / "smart"
WCTEMP_K = 343  # a drive's id-ctrl wctemp: 70 °C


def snapshot(name: str) -> Snapshot:
    return Snapshot.from_json(json.loads((SMART / f"{name}.json").read_text()))


def verdicts(after: str, family: str = "integrity") -> dict[str, bool]:
    """Metric -> passed, for the gen5-tlc profile's health criteria over healthy-before ->
    `after` during `family`."""
    profile = load_profile("gen5-tlc", registry())
    out = {}
    for m in measurements(family, snapshot("healthy-before"), snapshot(after), target="t",
                          wctemp_k=WCTEMP_K, kernel_written=16 << 30):
        for c in profile.criteria_for(m.id):
            out[m.metric] = all(v.passed for v in c.judge(m.value))
    return out


def by_metric(after: str) -> dict:
    return {m.metric: m for m in measurements(
        "bandwidth", snapshot("healthy-before"), snapshot(after), target="t", wctemp_k=WCTEMP_K,
        kernel_written=16 << 30)}


def test_a_healthy_pair_passes_every_criterion():
    assert verdicts("healthy-after") == {
        "health_critical_warning": True, "health_media_errors": True,
        "health_temperature_headroom": True, "health_spare_headroom": True,
        "health_thermal_transitions": True}


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
