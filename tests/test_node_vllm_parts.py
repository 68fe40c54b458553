"""vLLM for the node in parts: the closure of wheels, the trimmed wheel, and node.sh putting the parts together.

Fast: small wheels written here (a stand-in vllm with files to trim, its requirements, one behind an extra),
no network (``fetch=False``: every wheel is already in the cache folder). The node side runs for real:
``bash node.sh --part ...`` with the packed ``node_parts.py`` and this Python's pip.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bakeoff.errors import BakeoffError
from bakeoff.node import parts as node_parts
from bakeoff.node.vllm import collect_wheels, default_part_bytes, pack_vllm, trim_wheel

TRIM = {"vllm/_fa2_C*": "stand-in for FA2", "vllm/third_party/deep_gemm/*": "stand-in for DeepGEMM"}


def wheel(dest: Path, name: str, version: str, requires: list[str] = (), files: dict[str, bytes] | None = None) -> Path:
    """A minimal valid pure-Python wheel (METADATA, WHEEL, RECORD) that pip installs."""
    mod = name.replace("-", "_")
    files = files if files is not None else {f"{mod}/__init__.py": f"VERSION = {version!r}\n".encode()}
    info = f"{mod}-{version}.dist-info"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *[f"Requires-Dist: {r}\n" for r in requires]])
    files = {**files, f"{info}/METADATA": meta.encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},"
                     f"{len(d)}\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    path = dest / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in {**files, f"{info}/RECORD": record.encode()}.items():
            z.writestr(p, d)
    return path


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A download cache holding a stand-in vllm 0.24.0 and its requirements (two versions of one)."""
    c = tmp_path / "cache"
    c.mkdir()
    wheel(c, "vllm", "0.24.0", ["numpy", "fastapi[standard]>=0.133", "flashinfer-python==0.6.12",
                                "pydantic>=2.12", "setuptools<81; python_version > '3.11'",
                                "oldpy-only; python_version < '3.10'"],
          files={"vllm/__init__.py": b"__version__ = '0.24.0'\n", "vllm/_C.abi3.so": os.urandom(20000),
                 "vllm/_fa2_C.abi3.so": os.urandom(30000), "vllm/third_party/deep_gemm/k.py": b"x = 1\n"})
    wheel(c, "fastapi", "0.135.0", ["starlette>=1", "uvicorn>=0.30; extra == 'standard'", "pydantic>=2"])
    wheel(c, "starlette", "1.0.2")
    wheel(c, "uvicorn", "0.40.0")
    wheel(c, "pydantic", "2.12.5", ["typing-extensions"])
    wheel(c, "pydantic", "2.11.0", ["typing-extensions"])
    wheel(c, "setuptools", "80.0.0")
    return c


NODE = {"numpy": "2.5.2", "typing-extensions": None, "torch": "2.11.0"}
NOT_CARRIED = {"flashinfer-python": "not on Hopper's path"}


def test_closure_follows_extras_and_markers_and_leaves_out_what_the_node_has(cache: Path):
    c = collect_wheels("vllm==0.24.0", cache, node=NODE, not_carried=NOT_CARRIED, fetch=False, mismatch_ok={})
    assert set(c.wheels) == {"vllm", "fastapi", "starlette", "uvicorn", "pydantic", "setuptools"}
    assert c.wheels["pydantic"].name == "pydantic-2.12.5-py3-none-any.whl"  # vllm needs >=2.12: not 2.11
    assert "uvicorn" in c.wheels and "fastapi[standard] 0.135.0" in c.required_by["uvicorn"]
    assert set(c.on_node) == {"numpy", "typing-extensions"} and c.not_carried == NOT_CARRIED
    assert "oldpy-only" not in c.wheels  # its marker is false on the node's Python 3.12


def test_closure_refuses_a_requirement_the_node_cannot_meet_unless_accepted(cache: Path):
    wheel(cache, "vllm", "0.25.0", ["numpy>=3"])
    with pytest.raises(BakeoffError, match=r"needs numpy>=3.*node has numpy 2.5.2"):
        collect_wheels("vllm==0.25.0", cache, node=NODE, not_carried=NOT_CARRIED, fetch=False, mismatch_ok={})
    c = collect_wheels("vllm==0.25.0", cache, node=NODE, not_carried=NOT_CARRIED, fetch=False,
                       mismatch_ok={"numpy": "the node's torch needs it"})
    assert c.mismatches == [{"name": "numpy", "node_version": "2.5.2", "required": "numpy>=3", "by": "vllm 0.25.0",
                             "why_accepted": "the node's torch needs it"}]


def test_closure_chooses_again_when_a_later_requirement_excludes_the_first_choice(cache: Path):
    wheel(cache, "vllm", "0.27.0", ["otel-api>=1", "otel-sdk"])
    wheel(cache, "otel-sdk", "1.0.0", ["otel-api==1.0.0"])
    wheel(cache, "otel-api", "1.1.0")
    wheel(cache, "otel-api", "1.0.0")
    c = collect_wheels("vllm==0.27.0", cache, node=NODE, not_carried=NOT_CARRIED, fetch=False, mismatch_ok={})
    assert c.wheels["otel-api"].name == "otel_api-1.0.0-py3-none-any.whl"
    wheel(cache, "vllm", "0.28.0", ["otel-api>=1.1", "otel-sdk"])
    asked = r"otel-api==1.0.0,>=1.1 \(asked by otel-api>=1.1 \(vllm 0.28.0\), otel-api==1.0.0 \(otel-sdk 1.0.0\)"
    with pytest.raises(BakeoffError, match=asked):
        collect_wheels("vllm==0.28.0", cache, node=NODE, not_carried=NOT_CARRIED, fetch=False, mismatch_ok={})


def test_a_constraint_holds_a_package_back_where_its_newest_wheel_needs_what_another_pins_out(cache: Path):
    """vLLM 0.24.0 pins apache-tvm-ffi==0.1.9; the newest xgrammar it admits needs tvm-ffi>=0.1.11."""
    wheel(cache, "vllm", "0.29.0", ["tvm-ffi==0.1.9", "xgram>=0.2.1"])
    wheel(cache, "xgram", "0.2.9", ["tvm-ffi>=0.1.11"])
    wheel(cache, "xgram", "0.2.2", ["tvm-ffi>=0.1.9"])
    wheel(cache, "tvm-ffi", "0.1.9")
    wheel(cache, "tvm-ffi", "0.1.11")
    with pytest.raises(BakeoffError, match=r"tvm-ffi"):
        collect_wheels("vllm==0.29.0", cache, node=NODE, not_carried=NOT_CARRIED, fetch=False, mismatch_ok={},
                       constraints={})
    held = {"xgram": ("<=0.2.2", "its 0.2.6+ need tvm-ffi>=0.1.10")}
    c = collect_wheels("vllm==0.29.0", cache, node=NODE, not_carried=NOT_CARRIED, fetch=False, mismatch_ok={},
                       constraints=held)
    assert c.wheels["xgram"].name == "xgram-0.2.2-py3-none-any.whl"
    assert c.wheels["tvm-ffi"].name == "tvm_ffi-0.1.9-py3-none-any.whl"
    assert any(r.startswith("constraint <=0.2.2") for r in c.required_by["xgram"])


def test_closure_names_what_is_missing_offline(cache: Path):
    wheel(cache, "vllm", "0.26.0", ["nothere>=1"])
    with pytest.raises(BakeoffError, match="nothere>=1"):
        collect_wheels("vllm==0.26.0", cache, node=NODE, not_carried=NOT_CARRIED, fetch=False, mismatch_ok={})


def test_trim_removes_the_files_and_their_record_lines(cache: Path, tmp_path: Path):
    out = tmp_path / "trimmed.whl"
    removed = trim_wheel(cache / "vllm-0.24.0-py3-none-any.whl", out, TRIM)
    names = zipfile.ZipFile(out).namelist()
    assert "vllm/_fa2_C.abi3.so" not in names and "vllm/_C.abi3.so" in names
    record = zipfile.ZipFile(out).read("vllm-0.24.0.dist-info/RECORD").decode()
    assert "_fa2_C" not in record and "vllm/_C.abi3.so" in record
    assert {r["pattern"]: r["files"] for r in removed} == {"vllm/_fa2_C*": 1, "vllm/third_party/deep_gemm/*": 1}
    with pytest.raises(BakeoffError, match="match no file"):
        trim_wheel(cache / "vllm-0.24.0-py3-none-any.whl", tmp_path / "t2.whl", {"vllm/nothing*": "?"})
    assert not (tmp_path / "t2.whl").exists()


@pytest.fixture
def packed(cache: Path, tmp_path: Path) -> tuple[Path, dict]:
    out = tmp_path / "build" / "node-vllm"
    m = pack_vllm(version="0.24.0", wheels=cache, out=out, part_bytes=8 * 1024, target=str(tmp_path / "site"),
                  fetch=False, node=NODE, not_carried=NOT_CARRIED, trim=TRIM, mismatch_ok={})
    return out, m


def test_pack_writes_parts_with_sha256_and_one_manifest(packed: tuple[Path, dict]):
    out, m = packed
    assert len(m["parts"]) >= 3 and all(p["bytes"] <= 8 * 1024 for p in m["parts"])
    for p in m["parts"]:
        assert node_parts.sha256_file(out / p["name"]) == p["sha256"]
    joined = b"".join((out / p["name"]).read_bytes() for p in m["parts"])
    assert hashlib.sha256(joined).hexdigest() == m["payload"]["sha256"] and len(joined) == m["payload"]["bytes"]
    assert json.loads((out / "manifest.json").read_text()) == m
    assert [r["pattern"] for r in m["vllm_wheel"]["removed"]] == list(TRIM)
    assert m["vllm_wheel"]["trimmed_bytes"] < m["vllm_wheel"]["original_bytes"] - 20000
    assert m["not_carried"] == [{"name": "flashinfer-python", "why": "not on Hopper's path"}]
    assert {r["name"] for r in m["dependencies"]["files"]} == {"fastapi", "starlette", "uvicorn", "pydantic", "setuptools"}
    assert (out / "node.sh").exists() and (out / "node_parts.py").exists()


def _send(out: Path, *names: str, state: Path) -> subprocess.CompletedProcess:
    """One call on the node: node.sh with the parts that came in it."""
    args = [a for n in names for a in ("--part", str(out / n))]
    env = {**os.environ, "BAKEOFF_PARTS_DIR": str(state), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(out / "node.sh"), *args], capture_output=True, text=True, env=env, timeout=120)


def test_node_installs_only_once_every_part_has_come_and_takes_a_repeat_once(packed: tuple[Path, dict],
                                                                             tmp_path: Path):
    out, m = packed
    site, state = tmp_path / "site", tmp_path / "state"
    names = [p["name"] for p in m["parts"]]
    for i, name in enumerate(names[:-1]):
        r = _send(out, name, state=state)
        assert r.returncode == 0, r.stderr
        assert f"waiting for {len(names) - i - 1} of {len(names)} parts" in r.stdout and not site.exists()
    r = _send(out, names[0], state=state)  # sent twice
    assert r.returncode == 0 and "already here, sent twice" in r.stdout and not site.exists()
    r = _send(out, names[-1], state=state)
    assert r.returncode == 0, r.stderr
    assert "installed vllm 0.24.0" in r.stdout
    assert (site / "vllm" / "_C.abi3.so").exists() and not (site / "vllm" / "_fa2_C.abi3.so").exists()
    assert not (site / "vllm" / "third_party" / "deep_gemm").exists()
    probe = subprocess.run([sys.executable, "-c", "import vllm, fastapi, uvicorn, pydantic; print(vllm.__version__, "
                            "pydantic.VERSION)"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)},
                           cwd=tmp_path)
    assert probe.stdout.split() == ["0.24.0", "2.12.5"], probe.stderr
    r = _send(out, names[-1], state=state)  # the last part again, after the install
    assert r.returncode == 0 and "already installed" in r.stdout


def test_a_missing_part_installs_nothing_and_is_named(packed: tuple[Path, dict], tmp_path: Path):
    out, m = packed
    state, site = tmp_path / "state", tmp_path / "site"
    names = [p["name"] for p in m["parts"]]
    r = _send(out, *[n for n in names if n != "part-02"], state=state)
    assert r.returncode == 0 and "waiting for 1 of" in r.stdout and "part-02" in r.stdout
    assert not site.exists()
    with pytest.raises(node_parts.CarryError, match=r"1 of \d+ parts have not come: part-02"):
        node_parts.install(m, state, site)
    assert not site.exists() and not list(site.parent.glob(".carry-*"))  # nothing half-written left


def test_a_corrupted_part_is_refused_by_name_and_nothing_is_kept(packed: tuple[Path, dict], tmp_path: Path):
    out, m = packed
    state, site = tmp_path / "state", tmp_path / "site"
    bad = bytearray((out / "part-02").read_bytes())
    bad[100] ^= 0xFF
    (out / "part-02").write_bytes(bytes(bad))
    r = _send(out, "part-01", "part-02", state=state)
    assert r.returncode == 4 and "part-02 is corrupted" in r.stderr and "Send part-02 again" in r.stderr
    assert node_parts.missing(m, state) == [p["name"] for p in m["parts"]]  # part-01 of that call not kept either
    assert not site.exists()


def test_a_part_corrupted_on_the_node_is_caught_at_assembly(packed: tuple[Path, dict], tmp_path: Path):
    out, m = packed
    state, site = tmp_path / "state", tmp_path / "site"
    names = [p["name"] for p in m["parts"]]
    assert _send(out, *names[:-1], state=state).returncode == 0
    kept = next(state.glob("*/parts/part-01"))
    kept.write_bytes(b"\0" + kept.read_bytes()[1:])
    r = _send(out, names[-1], state=state)
    assert r.returncode == 4 and "part-01 is corrupted on the node" in r.stderr and not site.exists()
    assert node_parts.missing(m, state) == ["part-01"]


def test_default_part_size_leaves_room_for_the_working_tree(tmp_path: Path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "big.bin").write_bytes(b"\0" * (20 << 20))
    part, why = default_part_bytes(repo, extra_bytes=256 * 1024)
    assert part == (64 << 20) - (20 << 20) - 256 * 1024 - (1 << 20) and "20.0 MiB" in why
    (repo / "big.bin").write_bytes(b"\0" * 2)
    assert default_part_bytes(repo)[0] == 55 << 20
