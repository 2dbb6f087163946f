"""nvme-cli in one module, and the PTS purge as a guarded operation (qual/targets/nvme.py). There
is no NVMe drive here: two loop devices stand in for two namespaces of one controller (block
device nodes named nvme9n1 and nvme9n2, made beside each other), and a stand-in `nvme` on PATH
answers Identify Controller (its FNA), the active namespace list, and records any format."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from qual.targets import Target, nvme
from qual.targets.guard import UnsafeTarget
from qual.workloads import pts

from testbed import needs_root, sh

STANDIN = '''#!{python}
import json, os, sys
conf = json.load(open(os.environ["NVME_STANDIN"]))
with open(conf["log"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
cmd = sys.argv[1]
if cmd == "id-ctrl" and conf.get("fna") is not None:
    print(json.dumps({{"sn": "STANDIN", "fna": conf["fna"]}}))
elif cmd == "list-ns":
    print(json.dumps({{"nsid_list": [{{"nsid": n}} for n in conf["nsids"]]}}))
elif cmd == "format":
    pass
else:
    sys.exit(1)
'''


@pytest.fixture
def controller(tmp_path, loop_device, monkeypatch):
    """Two namespaces of one stand-in controller: (nvme9n1, nvme9n2, configure(fna, nsids),
    formats()). nvme9n2 is clean unless a test puts a filesystem on it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvme"
    tool.write_text(STANDIN.format(python=sys.executable))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    conf, log = tmp_path / "nvme.json", tmp_path / "nvme.log"
    log.touch()
    monkeypatch.setenv("NVME_STANDIN", str(conf))
    dev = tmp_path / "dev"
    dev.mkdir()
    nodes = []
    for i, name in enumerate(("nvme9n1", "nvme9n2"), start=1):
        loop = loop_device(16 << 20, name=f"ns{i}.img")
        st = os.stat(loop)
        node = dev / name
        os.mknod(node, 0o600 | 0o060000, st.st_rdev)  # a block device node, as udev makes
        nodes.append((node, loop))

    def configure(fna, nsids=(1, 2)):
        conf.write_text(json.dumps({"fna": fna, "nsids": list(nsids), "log": str(log)}))

    def formats():
        return [line for line in log.read_text().splitlines() if line.startswith("format")]
    return nodes[0], nodes[1], configure, formats


def namespace(node: Path, loops: list[str]) -> Target:
    """The namespace as a guarded target: both flags, each stand-in's serial confirmed (a loop
    device's serial is its backing file; a real controller's namespaces share one)."""
    serials = [Target(loop).identity.serial for loop in loops]
    return Target(node, allow_destructive=True, confirm_serial=serials)


def purge(first, second) -> dict:
    return pts.purge(namespace(first[0], [first[1], second[1]]), {"purge": True,
                                                                  "size": 4 << 20})


@pytest.mark.parametrize("fna, ses, reaches", [
    (0b01, 0, True), (0b01, 1, True),  # bit 0: every format reaches every namespace
    (0b10, 1, True), (0b10, 2, True),  # bit 1: every secure erase does
    (0b10, 0, False), (0b00, 1, False), (0b100, 2, False)])  # bit 2 only says crypto erase exists
def test_fna_says_whether_a_format_reaches_every_namespace(fna, ses, reaches):
    assert nvme.reaches_all_namespaces(fna, ses) is reaches


@needs_root
@pytest.mark.parametrize("fna", [0b01, 0b10, 0b11])
def test_a_purge_that_reaches_another_namespace_with_data_is_refused(controller, loop_device,
                                                                     fna):
    first, second, configure, formats = controller
    configure(fna)
    sh("mkfs.ext4", "-q", "-F", second[1])  # the other namespace holds a filesystem
    with pytest.raises(UnsafeTarget) as e:
        purge(first, second)
    assert "format reaches every namespace" in str(e.value)
    assert f"{second[0]} (" in str(e.value) and "nothing was formatted" in str(e.value)
    assert formats() == []


@needs_root
def test_a_purge_formats_when_every_namespace_it_reaches_passes_the_guard(controller):
    first, second, configure, formats = controller
    configure(0b01)
    done = purge(first, second)
    assert done["done"] and done["method"] == "nvme format --ses=1"
    assert done["namespaces"] == [str(first[0]), str(second[0])]
    assert formats() == [f"format {first[0]} --ses=1 --force"]


@needs_root
def test_a_format_of_one_namespace_alone_ignores_the_others(controller, loop_device):
    first, second, configure, formats = controller
    configure(0b00)
    sh("mkfs.ext4", "-q", "-F", second[1])  # not reached: FNA says the format is per namespace
    done = purge(first, second)
    assert done["namespaces"] == [str(first[0])]
    assert formats() == [f"format {first[0]} --ses=1 --force"]


@needs_root
@pytest.mark.parametrize("fna, nsids, why", [
    (None, (1, 2), "Identify Controller (FNA) could not be read"),
    (0b01, (1, 2, 3), "has 3 active namespaces, 2 with a device node here"),
])
def test_a_purge_whose_reach_cannot_be_known_is_refused(controller, fna, nsids, why):
    first, second, configure, formats = controller
    configure(fna, nsids)
    with pytest.raises(UnsafeTarget) as e:
        purge(first, second)
    assert why in str(e.value)
    assert formats() == []
