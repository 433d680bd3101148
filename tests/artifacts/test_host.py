"""The host profile on real /proc/cpuinfo text, cgroup folders laid out as the kernel does, this very
host, and the warning a bundle gives when served on a host lacking what its speed was measured with."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import onnxruntime
import pytest

from temper.artifacts.core import host
from temper.artifacts.core.host import X86_FEATURES, HostProfile, LoadMeter, _cgroup_quota, parse_cpuinfo
from temper.artifacts.formats import bundle
from temper.artifacts.registry.pyfunc import TemperModel
from temper.artifacts.serving.runtime import Runtime
from tests.artifacts.runtimes import linear_model
from tests.artifacts.servers import _free_port, _wait_ready
from tests.helpers import REPO

XEON = """\
processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model		: 85
model name	: Intel(R) Xeon(R) Platinum 8175M CPU @ 2.50GHz
stepping	: 4
cpu MHz		: 2499.998
cache size	: 33792 KB
physical id	: 0
siblings	: 2
core id		: 0
cpu cores	: 1
fpu		: yes
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss \
ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid aperfmperf tsc_known_freq pni \
pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand \
hypervisor lahf_lm abm 3dnowprefetch invpcid_single pti fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm \
mpx avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves ida \
arat pku ospke
bugs		: cpu_meltdown spectre_v1 spectre_v2 spec_store_bypass l1tf mds swapgs itlb_multihit mmio_stale_data
bogomips	: 4999.99
address sizes	: 46 bits physical, 48 bits virtual

processor	: 1
vendor_id	: GenuineIntel
cpu family	: 6
model		: 85
model name	: Intel(R) Xeon(R) Platinum 8175M CPU @ 2.50GHz
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss \
ht syscall nx pdpe1gb rdtscp lm constant_tsc pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq \
avx512cd avx512bw avx512vl
bogomips	: 4999.99
"""

EPYC = """\
processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 17
model name	: AMD EPYC 9R14 96-Core Processor
stepping	: 1
cpu MHz		: 3699.998
cache size	: 1024 KB
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht \
syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid extd_apicid aperfmperf \
tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand \
hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch topoext perfctr_core invpcid_single ssbd \
ibrs ibpb stibp vmmcall fsgsbase bmi1 avx2 smep bmi2 invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt \
clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx512_bf16 clzero xsaveerptr rdpru wbnoinvd \
arat avx512vbmi pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid fsrm
bugs		: sysret_ss_attrs spectre_v1 spectre_v2 spec_store_bypass srso
bogomips	: 5199.99
"""

GRAVITON2 = """\
processor	: 0
BogoMIPS	: 243.75
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: 0x3
CPU part	: 0xd0c
CPU revision	: 1

processor	: 1
BogoMIPS	: 243.75
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: 0x3
CPU part	: 0xd0c
CPU revision	: 1
"""


def test_parse_cpuinfo_takes_the_first_processor_of_an_intel_xeon() -> None:
    name, flags = parse_cpuinfo(XEON)
    assert name == "Intel(R) Xeon(R) Platinum 8175M CPU @ 2.50GHz"
    assert {"avx2", "fma", "f16c", "avx512f", "avx512bw"} <= flags
    assert not flags & {"avx512_vnni", "avx_vnni", "amx_int8"} and "bugs" not in flags


def test_parse_cpuinfo_of_an_amd_epyc_with_vnni() -> None:
    name, flags = parse_cpuinfo(EPYC)
    assert name == "AMD EPYC 9R14 96-Core Processor"
    assert {"avx512_vnni", "avx512_bf16", "avx512f", "avx2"} <= flags and "amx_int8" not in flags


def test_parse_cpuinfo_of_an_arm64_names_it_by_implementer() -> None:
    name, flags = parse_cpuinfo(GRAVITON2)
    assert name == "arm64 (implementer 0x41)"
    assert {"asimd", "asimddp", "fphp", "asimdhp"} <= flags and "i8mm" not in flags


def test_parse_cpuinfo_without_a_feature_list() -> None:
    assert parse_cpuinfo("") == ("", None)


def _profile_of(cpuinfo: str, arch: str, monkeypatch: pytest.MonkeyPatch) -> HostProfile:
    """profile() on another machine: its /proc/cpuinfo text and architecture fed in at the I/O edge."""
    monkeypatch.setattr(host, "_cpuinfo", lambda: parse_cpuinfo(cpuinfo))
    monkeypatch.setattr(host.platform, "machine", lambda: arch)
    return host.profile()


def test_profile_features_plain_names_and_what_a_xeon_lacks_against_an_epyc(monkeypatch: pytest.MonkeyPatch) -> None:
    xeon = _profile_of(XEON, "x86_64", monkeypatch)
    epyc = _profile_of(EPYC, "x86_64", monkeypatch)
    arm = _profile_of(GRAVITON2, "aarch64", monkeypatch)
    assert xeon.features == ["avx2", "fma", "f16c", "avx512f", "avx512bw"] and xeon.x86 and not xeon.vnni
    assert epyc.features == ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"] and epyc.vnni
    assert arm.features == ["asimd", "dotprod", "fp16", "asimd_fp16"] and arm.arm64 and not arm.x86
    assert xeon.missing(epyc) == ["avx512_vnni", "avx512_bf16"] and epyc.missing(xeon) == []
    assert arm.missing(epyc) == [] and epyc.missing(arm) == []  # another architecture: nothing comparable
    assert "Intel(R) Xeon(R) Platinum 8175M" in xeon.summary() and "avx512bw" in xeon.summary()


def test_cgroup_v2_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert _cgroup_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _cgroup_quota(tmp_path) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert _cgroup_quota(tmp_path) == 2.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert _cgroup_quota(tmp_path) is None


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert _cgroup_quota(tmp_path) is None


def test_profile_of_this_host() -> None:
    p = host.profile()
    assert 1 <= p.usable_cores <= (os.cpu_count() or 1) and p.usable_cores == host.usable_cores()
    assert p.onnxruntime == onnxruntime.__version__ and "CPUExecutionProvider" in p.providers
    if sys.platform.startswith("linux"):
        assert p.features_known and p.cpu
    assert HostProfile.model_validate(p.model_dump()) == p
    assert HostProfile.model_validate_json(p.model_dump_json()) == p
    assert p.missing(p) == []


def test_missing_names_the_extra_feature_unless_a_side_is_unknown() -> None:
    p = host.profile()
    richer = p.model_copy(update={"features": [*p.features, "made_up_feature"], "features_known": True})
    known = p.model_copy(update={"features_known": True})
    assert known.missing(richer) == ["made_up_feature"] and richer.missing(known) == []
    assert known.model_copy(update={"features_known": False}).missing(richer) == []
    assert known.missing(richer.model_copy(update={"features_known": False})) == []


def test_load_meter_sees_cpu_work() -> None:
    meter = LoadMeter()
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        sum(i * i for i in range(1000))
    load = meter.read()
    assert load.busy_pct is not None and load.busy_pct > 0
    assert load.steal_pct is not None and 0 <= load.steal_pct <= 100
    assert set(load.as_dict()) == {"load_1m", "steal_pct", "busy_pct"}


# -- the warning when serving ---------------------------------------------------------------------


def _lacking() -> tuple[HostProfile, str]:
    """This host's profile and an x86 feature it lacks (the test is skipped on a host that has them all)."""
    here = host.profile()
    if not here.features_known:
        pytest.skip("this OS gives no CPU feature list, so nothing can be found missing")
    extra = next((f for f in X86_FEATURES if f not in here.features), None)
    if extra is None:
        pytest.skip(f"this host has every feature of {X86_FEATURES}: none to be missing")
    return here, extra


def _bundle(tmp_path: Path, measured_on: HostProfile | None) -> Path:
    model = linear_model(tmp_path)
    return bundle.write(tmp_path / "bundle", model, bundle.config_for(model, "linear", measured_on=measured_on))


def _measured_elsewhere(tmp_path: Path) -> tuple[Path, str]:
    """A bundle whose speed was measured on this host plus one feature it lacks, and that feature."""
    here, extra = _lacking()
    richer = here.model_copy(update={"cpu": "AMD EPYC 9R14 96-Core Processor", "features": [*here.features, extra]})
    return _bundle(tmp_path, richer), extra


def test_runtime_warns_when_this_host_lacks_a_measured_feature(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    folder, extra = _measured_elsewhere(tmp_path)
    assert json.loads((folder / bundle.CONFIG).read_text())["measured_on"]["features"][-1] == extra
    with caplog.at_level(logging.WARNING, logger="temper.serving"):
        runtime = Runtime(folder)
    warning = runtime.host_warning
    assert warning is not None and "\n" not in warning
    assert f"lacks {extra}," in warning and "on AMD EPYC 9R14" in warning and host.profile().cpu in warning
    assert any(warning in record.getMessage() for record in caplog.records)


def test_no_warning_on_the_host_it_was_measured_on(tmp_path: Path) -> None:
    assert Runtime(_bundle(tmp_path, host.profile())).host_warning is None


def test_an_old_runtime_json_without_measured_on_loads_and_warns_nothing(tmp_path: Path) -> None:
    folder = _bundle(tmp_path, None)
    config = json.loads((folder / bundle.CONFIG).read_text())
    del config["measured_on"]
    (folder / bundle.CONFIG).write_text(json.dumps(config))
    assert bundle.read(folder).measured_on is None
    assert Runtime(folder).host_warning is None


def test_pyfunc_load_warns(tmp_path: Path) -> None:
    folder, extra = _measured_elsewhere(tmp_path)
    with pytest.warns(RuntimeWarning, match=extra):
        TemperModel().load_context(mlflow.pyfunc.PythonModelContext({"bundle": str(folder)}, None))


def test_temper_serve_prints_the_warning(tmp_path: Path) -> None:
    folder, extra = _measured_elsewhere(tmp_path)
    script = Path(sys.executable).with_name("temper")
    assert script.is_file(), f"the temper console script is not installed next to {sys.executable}"
    port = _free_port()
    process = subprocess.Popen([str(script), "serve", str(folder), "--port", str(port)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(process, port)
    finally:
        process.send_signal(signal.SIGINT)  # by its PID, and only while it has not been reaped
        try:
            stdout, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
    warnings = [line for line in stderr.splitlines() if line.startswith("warning: ")]
    host_warnings = [line for line in warnings if "lacks" in line]
    assert len(host_warnings) == 1 and f"lacks {extra}," in host_warnings[0], stderr
    # the one other line: this hand-made bundle has no manifest.json to check its model against
    assert len(warnings) == 2 and any("has no manifest.json" in line for line in warnings), stderr
    assert "serving linear" in stdout and "127.0.0.1" in stdout
