"""The NVMe test bed: a guest kernel with QEMU's emulated NVMe controllers, booted over this
machine's own userspace (virtme-ng), so that qual, as installed here, meets a controller that
answers NVMe commands through the distribution kernel's own `nvme` driver.

A `Guest` is told its drives (`Drive`: namespaces, their size and LBA size, the serial, a
hot-pluggable slot, a medium error at a chosen sector, a throttle), boots, runs one shell
script in the guest and ends. The test reads what the guest wrote under `Guest.shared` (the
one folder the guest may write on the host, over 9p) and its console output; while the
script runs, QEMU's machine protocol (`Guest.qmp`) acts on the drives from outside:
`set_critical_warning`, `pull` (the controller leaves its slot), `throttle`. Every wait has a bound. QEMU runs under a
keeper process of its own group that kills the whole group when the test's process dies,
however it dies; `close()` kills it and removes every file the guest had.

Run by hand: `scripts/nvme-guest --drive serial=S1,size=256M --drive serial=S2,slot=1 -- CMD`
(`--help` says the rest)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BOOT_S = 120  # a TCG boot takes about 10 s on 2 cores; a loaded host may take several times it
KVM_PROBE_S = 30  # nested KVM hangs or fails at boot on some hosts: a probe decides, bounded
QMP_S = 20  # one QMP command's answer
TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "vng": "virtme-ng (pip)",
         "busybox": "busybox-static"}


def kernel() -> Path | None:
    """The distribution's full kernel (Debian's linux-image-amd64: its 9p and nvme drivers are
    modules the guest loads), the newest one installed."""
    found = sorted(Path("/boot").glob("vmlinuz-*-amd64"))
    return found[-1] if found else None


def missing() -> str | None:
    """Why no guest can boot here (None: one can): the tools scripts/setup installs."""
    absent = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if kernel() is None:
        absent.append("linux-image-amd64")
    if os.geteuid() != 0:
        return "the NVMe test bed runs as root (the guest runs qual as root over the host's /)"
    return f"the NVMe test bed needs {', '.join(absent)} (scripts/setup installs them)" \
        if absent else None


# shell functions for the guest's scripts: a namespace's and a controller's node by serial
FIND = r"""
dev() {  # dev SERIAL [NSID]: the namespace's block device (a shared one's sits in its
         # subsystem, a private one's in its controller; nvmeXcYnZ is a path, not a device)
  for d in /sys/class/nvme-subsystem/nvme-subsys* /sys/class/nvme/nvme*; do
    [ "$(tr -d ' ' < $d/serial)" = "$1" ] || continue
    for b in $d/nvme*n${2:-1}; do
      case ${b##*/} in *c*n*) continue;; esac
      [ -e "$b" ] && echo /dev/${b##*/} && return 0
    done
  done; return 1; }
ctrl() {  # ctrl SERIAL: the controller's character device
  for c in /sys/class/nvme/nvme*; do
    [ "$(tr -d ' ' < $c/serial)" = "$1" ] && echo /dev/$(basename $c) && return 0
  done; return 1; }
"""


# qual in the guest: the suites as `qual run` runs them, and the record of a drive

PROFILE = REPO / "tests" / "profiles" / "nvme.toml"
SUITES = REPO / "suites"


def suite_run(results: str, targets: list[str], *args: str, profile: Path = PROFILE) -> str:
    """A shell line running the suites as `qual run` does, without Allure (so no chart is
    drawn: matplotlib's import alone is 20 s of the guest's CPU)."""
    cmd = ["python3", "-m", "pytest", str(SUITES), "-c", str(SUITES / "pytest.ini"),
           f"--qual-profile={profile}", f"--qual-results={results}", "-p", "no:cacheprovider",
           "-p", "no:benchmark", "-p", "no:hypothesispytest", "--qual-allow-destructive",
           "-o", "console_output_style=classic", *args]
    return shlex.join(cmd) + " " + " ".join(
        f'--qual-target=$(dev {t}) --qual-confirm-serial={t}' for t in targets)


def record_of(results: Path, serial: str) -> dict:
    for path in results.rglob("qual-run.json"):
        doc = json.loads(path.read_text())
        if doc["target"]["identity"]["serial"] == serial:
            return doc
    raise AssertionError(f"no record of {serial} under {results}")


# A controller behind a root port shows the guest a 2.5 GT/s x1 link (what QEMU 7.2 reports,
# whatever the port's x-speed), which carries 238 MiB/s: QEMU itself moves more, so qual would
# rightly refuse a figure faster than the link. A slot's drive is throttled below it.
SLOT_LINK_BPS = 200 << 20


@dataclass(frozen=True)
class Drive:
    """One emulated NVMe controller and its namespaces, each a file the test owns."""

    serial: str
    size: int = 256 << 20  # each namespace's
    namespaces: int = 1  # more than one: the controller sits in an NVM subsystem (nvme-subsys)
    lba: int = 512  # logical block size
    slot: bool = False  # on a PCIe root port of its own, so that it can leave the bus
    error_at: int | None = None  # a sector (512 B) whose I/Os fail (blkdebug)
    error_on: tuple[str, ...] = ("read", "write")  # which of them fail there
    throttle_bps: int | None = None  # QEMU's block throttling, in bytes a second

    @classmethod
    def parse(cls, text: str) -> Drive:
        """`serial=S,size=256M,namespaces=2,lba=4096,slot=1,error-at=100000,throttle=50M`"""
        kv = dict(part.split("=", 1) for part in text.split(",") if part)
        sizes = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

        def size(v: str) -> int:
            return int(v[:-1]) * sizes[v[-1].upper()] if v[-1].upper() in sizes else int(v)
        return cls(serial=kv["serial"], size=size(kv.get("size", "256M")),
                   namespaces=int(kv.get("namespaces", 1)), lba=int(kv.get("lba", 512)),
                   slot=kv.get("slot", "0") not in ("0", ""),
                   error_at=int(kv["error-at"]) if "error-at" in kv else None,
                   throttle_bps=size(kv["throttle"]) if "throttle" in kv else None)


class QmpError(RuntimeError):
    pass


class Qmp:
    """QEMU's machine protocol on the guest's unix socket: one command at a time, each answer
    awaited at most QMP_S; events are kept in `events`."""

    def __init__(self, path: Path, alive=lambda: True):
        self.events: list[dict] = []
        deadline = time.monotonic() + BOOT_S
        while True:
            try:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._sock.settimeout(QMP_S)
                self._sock.connect(str(path))
                break
            except OSError:
                self._sock.close()
                if not alive():
                    raise QmpError("QEMU ended before its QMP socket opened")
                if time.monotonic() > deadline:
                    raise QmpError(f"QEMU's QMP socket {path} did not open in {BOOT_S} s")
                time.sleep(0.1)
        self._buf = b""
        self._read()  # the greeting
        self.execute("qmp_capabilities")

    def _read(self) -> dict:
        while b"\n" not in self._buf:
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise QmpError("QEMU closed its QMP socket")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def execute(self, command: str, **arguments):
        msg = {"execute": command, **({"arguments": arguments} if arguments else {})}
        self._sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            answer = self._read()
            if "event" in answer:
                self.events.append(answer)
            elif "error" in answer:
                raise QmpError(f"{command}: {answer['error'].get('desc', answer['error'])}")
            elif "return" in answer:
                return answer["return"]

    def wait_event(self, name: str, timeout: float, **data) -> dict:
        """The first event `name` QEMU sent whose data holds `data` (a device's removal:
        DEVICE_DELETED, device=ID), awaited and taken: a second wait waits for a second one."""
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e["event"] == name and all(e.get("data", {}).get(k) == v
                                              for k, v in data.items()):
                    self.events.remove(e)
                    return e
            left = deadline - time.monotonic()
            if left <= 0:
                raise QmpError(f"no {name} event within {timeout} s")
            self._sock.settimeout(left)
            try:
                answer = self._read()
            except socket.timeout:
                continue
            finally:
                self._sock.settimeout(QMP_S)
            if "event" in answer:
                self.events.append(answer)

    def close(self) -> None:
        self._sock.close()


_ACCEL: dict[str, bool] = {}


def kvm_works(kernel_path: Path) -> bool:
    """Whether this host boots a guest under KVM: a bounded boot probe, once a process. Nested
    KVM fails on some hosts (an emulation failure at boot, or a hang), so TCG is the default
    and KVM only where the probe's guest answered."""
    key = str(kernel_path)
    if key not in _ACCEL:
        ok = False
        if os.access("/dev/kvm", os.R_OK | os.W_OK) and os.environ.get("QUAL_GUEST_KVM") != "0":
            with tempfile.TemporaryDirectory(prefix="qual-kvm-probe-") as d:
                try:
                    out = _keeper_run(["vng", "--run", key, "--exec", "echo qual-kvm-ok"],
                                      Path(d), KVM_PROBE_S)
                    ok = "qual-kvm-ok" in out
                except subprocess.TimeoutExpired:
                    ok = False
        _ACCEL[key] = ok
    return _ACCEL[key]


def _font_cache() -> Path:
    """Where matplotlib keeps its font list on this machine (its cache folder)."""
    if os.environ.get("MPLCONFIGDIR"):
        return Path(os.environ["MPLCONFIGDIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "matplotlib"


def _keeper_run(cmd: list[str], where: Path, timeout: float) -> str:
    """Run `cmd` under a keeper, wait at most `timeout`, and return its output."""
    log = where / "probe.log"
    with open(log, "wb") as out:
        proc = keep(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=where)
    try:
        proc.wait(timeout)
    finally:
        stop(proc)
    return log.read_text(errors="replace")


def keep(cmd: list[str], **popen) -> subprocess.Popen:
    """Start `cmd` under a keeper: a process of a new group that dies with this one and, as it
    dies (or when `cmd` ends), kills its whole group (vng starts QEMU from a child of its own,
    so no signal to vng alone reaches QEMU)."""
    from qual.watchdog import dies_with_me

    return subprocess.Popen([sys.executable, __file__, "keep", "--", *cmd],
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=dies_with_me(), **popen)


def stop(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Kill a keeper's whole group and reap the keeper."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass


def _keeper(cmd: list[str]) -> int:
    """The keeper itself (run as `nvmeguest.py keep -- CMD`): runs CMD in its own group and kills
    the group when CMD ends or when the test's process dies (SIGTERM, from PDEATHSIG)."""
    import ctypes

    def end(*_):
        os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGHUP, end)
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: the test's death is ours
    if os.getppid() == 1:
        end()
    code = subprocess.call(cmd)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _kill_group_but_me()  # whatever CMD left behind (QEMU under vng's child)
    return code


def group_of(leader: int) -> dict[int, str]:
    """The processes of process group `leader`: pid -> command line."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == leader:
                found[int(stat.parent.name)] = (stat.parent / "cmdline").read_text()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return found


def _kill_group_but_me() -> None:
    me = os.getpid()
    for pid in group_of(me):  # the keeper leads its group
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class Guest:
    """A guest with `drives`, booted by `start(script)`; see the module's docstring."""

    drives: list[Drive]
    where: Path  # the test's own folder: the drives' files, the shared folder, the logs
    cpus: int = 1  # one host core: the tests beside it keep the other
    memory: str = "2G"
    reuse: bool = False  # boot over the drives' files a guest before left (a host power cut)
    proc: subprocess.Popen | None = field(default=None, init=False)
    qmp: Qmp | None = field(default=None, init=False)

    @property
    def shared(self) -> Path:
        """The one host folder the guest writes (mounted at the same path in the guest)."""
        return self.where / "shared"

    @property
    def console(self) -> Path:
        return self.where / "console.log"

    def image(self, drive: int, namespace: int = 1) -> Path:
        """The file behind a drive's namespace: its bytes from offset 0."""
        return self.where / f"{self.drives[drive].serial}-n{namespace}.img"

    def cached(self) -> list[Path]:
        """The folders the guest mounts again with its page cache on (read-only): this Python's
        and qual's. virtme-ng's root has none (every read crosses 9p), and a Python process
        there reads thousands of files: a cached mount halves the 15 s qual's import takes
        under an emulated CPU. /usr and / stay as they are (the guest writes over them)."""
        dirs = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), REPO}
        return sorted(d for d in dirs if d not in (Path("/"), Path("/usr")))

    def qemu_options(self) -> list[str]:
        """The drives as QEMU options: a root port per hot-pluggable controller, a subsystem
        where a controller has several namespaces, blkdebug under a namespace with an error;
        and a 9p export of each cached folder."""
        opts: list[str] = []
        for i, d in enumerate(self.cached()):
            opts += ["-virtfs", f"local,path={d},mount_tag=qualro{i},security_model=none,"
                     "readonly=on,multidevs=remap"]
        for i, d in enumerate(self.drives):
            ctrl = [f"nvme,id=ctrl{i},serial={d.serial}"]
            if d.slot:
                opts += ["-device", f"pcie-root-port,id=port{i},bus=pcie.0,chassis={i + 1},"
                         f"slot={i + 1}"]
                ctrl.append(f"bus=port{i}")
            if d.namespaces > 1:
                opts += ["-device", f"nvme-subsys,id=subsys{i},nqn=qual-{d.serial}"]
                ctrl.append(f"subsys=subsys{i}")
            for n in range(1, d.namespaces + 1):
                image = self.image(i, n)
                if not (self.reuse and image.exists()):
                    with open(image, "wb") as f:
                        f.truncate(d.size)
                node = f"drive{i}n{n}"
                opts += ["-blockdev", f"driver=file,filename={image},node-name={node}-file,"
                         "cache.direct=off"]
                below = f"{node}-file"
                if d.error_at is not None and n == 1:
                    rules = self.where / f"{d.serial}-blkdebug.conf"
                    rules.write_text("".join(
                        f'[inject-error]\nevent = "{event}"\nerrno = "5"\nsector = '
                        f'"{d.error_at}"\nonce = "off"\n\n' for event in (
                            f"{op}_aio" for op in d.error_on)))
                    opts += ["-blockdev", f"driver=blkdebug,node-name={node}-debug,"
                             f"config={rules},image={below}"]
                    below = f"{node}-debug"
                throttle = d.throttle_bps or (SLOT_LINK_BPS if d.slot else None)
                if throttle:
                    opts += ["-object", f"throttle-group,id={node}-tg,x-bps-total="
                             f"{throttle}"]
                    opts += ["-blockdev", f"driver=throttle,node-name={node}-throttle,"
                             f"throttle-group={node}-tg,file={below}"]
                    below = f"{node}-throttle"
                opts += ["-blockdev", f"driver=raw,node-name={node},file={below}"]
                lba = f"logical_block_size={d.lba},physical_block_size={d.lba}"
                if d.namespaces > 1:
                    ctrl_opts = ",".join(ctrl)
                    if n == 1:
                        opts += ["-device", ctrl_opts]
                    opts += ["-device", f"nvme-ns,drive={node},nsid={n},bus=ctrl{i},{lba}"]
                else:
                    opts += ["-device", ",".join(ctrl + [f"drive={node}", lba])]
        return opts

    def start(self, script: str, env: dict | None = None) -> None:
        """Boot and run `script` (bash) in the guest, in the shared folder, as root, with this
        Python first on PATH and `env` exported; returns once QMP answers."""
        why = missing()
        if why:
            raise RuntimeError(why)
        self.shared.mkdir(parents=True, exist_ok=True)
        exports = {"PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
                   "PYTHONDONTWRITEBYTECODE": "1", "QUAL_GUEST": "1", **(env or {})}
        # a home of the guest's own (the host's is read-only there), and matplotlib's font
        # list copied into it: built anew, it is 10 s of the guest's CPU in every process
        body = "export HOME=$(mktemp -d) MPLCONFIGDIR=$(mktemp -d)\n"
        body += f"cp {shlex.quote(str(_font_cache()))}/fontlist-*.json \"$MPLCONFIGDIR\" " \
                "2>/dev/null || true\n"
        body += "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in exports.items())
        body += "".join(f"mount -t 9p -o trans=virtio,version=9p2000.L,cache=loose,msize=512000,"
                        f"ro qualro{i} {shlex.quote(str(d))} 2>/dev/null || true\n"
                        for i, d in enumerate(self.cached()))
        (self.shared / "guest.sh").write_text(f"set -u\ncd {shlex.quote(str(self.shared))}\n"
                                              f"{body}{script}\n")
        k = kernel()
        sock = self.where / "qmp.sock"
        sock.unlink(missing_ok=True)  # a guest before this one's (a host cut's reboot)
        cmd = ["vng", "--run", str(k), "--cpus", str(self.cpus), "--memory", self.memory,
               "--rwdir", str(self.shared), "--cwd", str(self.shared),
               "--exec", f"bash {self.shared / 'guest.sh'}",
               "--qemu-opts=" + shlex.join(["-qmp", f"unix:{sock},server=on,wait=off",
                                          *self.qemu_options()])]
        if not kvm_works(k):
            cmd.insert(3, "--disable-kvm")
        with open(self.console, "wb") as out:
            self.proc = keep(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.where)
        try:
            self.qmp = Qmp(sock, alive=lambda: self.proc.poll() is None)
        except QmpError as e:
            console = self.output()
            self.close()
            raise QmpError(f"{e}:\n{console[-3000:]}") from None

    def wait_for(self, name: str, timeout: float) -> Path:
        """A file the guest's script makes under the shared folder, awaited (the script's way of
        saying where it is); fails early, with its console, if the guest ended first."""
        path = self.shared / name
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the guest ended before {name} appeared:\n{self.output()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not appear within {timeout} s:\n"
                                   f"{self.output()[-3000:]}")
            time.sleep(0.2)
        return path

    def wait(self, timeout: float) -> int:
        """The script's exit status, once the guest has ended (killed, and an error raised,
        past `timeout`)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise TimeoutError(f"the guest still ran after {timeout} s:\n"
                               f"{self.output()[-3000:]}") from None

    def output(self) -> str:
        return self.console.read_text(errors="replace") if self.console.exists() else ""

    # what a test does to a drive from outside while the guest runs (drives by their index)

    def set_critical_warning(self, drive: int, bits: int) -> None:
        """The controller's SMART critical warning byte, as the drive would raise it."""
        self.qmp.execute("qom-set", path=f"/machine/peripheral/ctrl{drive}",
                         property="smart_critical_warning", value=bits)

    def pull(self, drive: int, timeout: float = 60) -> None:
        """The controller leaves the bus (a hot removal from its slot), awaited until QEMU
        holds it no more (its ID free for a plug), not only until a DEVICE_DELETED: one left
        queued by an earlier removal would end the wait at once, and a plug, or a second
        removal (the guest takes a second press of the slot's button as a cancel), would meet
        the controller still there."""
        name = f"ctrl{drive}"
        self.qmp.events = [e for e in self.qmp.events if not (
            e["event"] == "DEVICE_DELETED" and e.get("data", {}).get("device") == name)]
        deadline = time.monotonic() + timeout
        self.qmp.execute("device_del", id=name)
        self.qmp.wait_event("DEVICE_DELETED", timeout, device=name)
        while name in {p["name"] for p in self.qmp.execute("qom-list",
                                                            path="/machine/peripheral")}:
            if time.monotonic() > deadline:
                raise QmpError(f"{name} still held by QEMU {timeout} s after device_del")
            time.sleep(0.1)

    def plug(self, drive: int, timeout: float = 60) -> None:
        """A pulled single-namespace controller back in its slot, over the same node (the same
        serial and bytes): the guest's hotplug finds it. QEMU may hold the pulled one's ID a
        while after its DEVICE_DELETED (a loaded host once refused the plug with `Duplicate
        device ID`): the plug is asked again until it takes, bounded."""
        d = self.drives[drive]
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.qmp.execute("device_add", driver="nvme", id=f"ctrl{drive}",
                                 serial=d.serial, bus=f"port{drive}", drive=f"drive{drive}n1",
                                 logical_block_size=d.lba, physical_block_size=d.lba)
                return
            except QmpError as e:
                if "Duplicate device ID" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def throttle(self, drive: int, bps: int) -> None:
        """The first namespace's throttle (a Drive made with one) set to `bps` bytes a second."""
        self.qmp.execute("qom-set", path=f"/objects/drive{drive}n1-tg", property="limits",
                         value={"bps-total": bps})

    def power_off(self) -> None:
        """Kill QEMU and the guest at once (the keeper's whole group), as a host losing its
        power: what QEMU had written to the drives' files stays, and the folder stays for a
        guest booted over it (`reuse`)."""
        if self.qmp:
            self.qmp.close()
            self.qmp = None
        if self.proc:
            leader = self.proc.pid
            stop(self.proc)
            self.proc = None
            deadline = time.monotonic() + 10  # QEMU itself gone, not only its keeper
            while group_of(leader) and time.monotonic() < deadline:
                time.sleep(0.05)

    def close(self) -> None:
        """Kill the guest and QEMU (the keeper's whole group) and remove every file it had."""
        self.power_off()
        kept = os.environ.get("QUAL_GUEST_KEEP")  # a developer's look at what a guest left
        if kept:
            shutil.copytree(self.where, Path(kept) / self.where.name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.img", "*.sock"))
        shutil.rmtree(self.where, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:2] == ["keep", "--"]:
        return _keeper(argv[2:])
    parser = argparse.ArgumentParser(
        prog="scripts/nvme-guest", description="Boot a guest with emulated NVMe controllers "
        "over this machine's userspace and run a command in it (qual as installed here).")
    parser.add_argument("--drive", action="append", default=[], type=Drive.parse,
                        help="serial=S[,size=256M][,namespaces=N][,lba=512][,slot=1]"
                             "[,error-at=SECTOR][,throttle=BYTES/s] (repeatable)")
    parser.add_argument("--cpus", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600, help="seconds (default 600)")
    parser.add_argument("command", nargs="+", help="the shell command to run in the guest")
    args = parser.parse_args(argv)
    why = missing()
    if why:
        print(why, file=sys.stderr)
        return 2
    guest = Guest(args.drive or [Drive("QUALNVME1")], Path(tempfile.mkdtemp(
        prefix="qual-guest-")), cpus=args.cpus)
    try:
        guest.start(" ".join(args.command))
        print(f"guest booting; QMP at {guest.where / 'qmp.sock'}; shared folder "
              f"{guest.shared}", file=sys.stderr)
        code = guest.wait(args.timeout)
        sys.stdout.write(guest.output())
        return code
    finally:
        guest.close()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main(sys.argv[1:]))
