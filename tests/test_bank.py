"""MemoryBank: editing, renormalisation, and the bank file with its load-time checks."""

import json
import os

import pytest
import safetensors.torch
import torch
from helpers import random_rows
from safetensors.torch import save_file

import tokmem
from tokmem.bank.memory_bank import MemoryBank
from tokmem.bank.file_format import metadata_path
from tokmem.errors import BankError

WIDTH = 8


def make_bank(names=("a", "b", "c"), decoupled=False, fingerprint="f0", seed=0) -> MemoryBank:
    bank = MemoryBank(WIDTH, decoupled=decoupled, backbone={"name": "test", "fingerprint": fingerprint})
    bank.add(names, torch.zeros(WIDTH), [f"does {n} — ünïcode" for n in names])
    random_rows(bank, seed)
    return bank


def snapshot(bank: MemoryBank) -> tuple:
    steer = bank.steer.clone() if bank.decoupled else None
    return list(bank.names), list(bank.descriptions), bank.index.clone(), steer, bank.trainable.clone()


def assert_same(a: tuple, b: tuple) -> None:
    assert a[:2] == b[:2]
    for x, y in zip(a[2:], b[2:]):
        assert (x is None and y is None) or torch.equal(x, y)


# ---- editing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("decoupled", [False, True])
def test_add_initialises_new_rows_to_init_and_marks_them_trainable(decoupled):
    bank = make_bank(decoupled=decoupled)
    bank.freeze()
    init = torch.randn(WIDTH)
    assert bank.add(["d", "e"], init) == [3, 4]
    assert bank.names[3:] == ["d", "e"]
    assert bank.trainable.tolist() == [False, False, False, True, True]
    assert bank.trainable_rows().tolist() == [3, 4]
    for row in (3, 4):
        assert torch.equal(bank.index[row], init)
        assert torch.equal(bank.steer_matrix[row], init)
    if decoupled:  # steer and index are separate storage
        bank.index[3] += 1
        assert torch.equal(bank.steer[3], init)


@pytest.mark.parametrize("names", [["a"], ["d", "d"], [""], ["  "], [" d"], [None]], ids=repr)
def test_add_rejects_duplicate_and_empty_names(names):
    bank = make_bank()
    before = snapshot(bank)
    with pytest.raises(BankError, match="already in the bank|invalid procedure name"):
        bank.add(names, torch.zeros(WIDTH))
    assert_same(snapshot(bank), before)


def test_add_rejects_an_init_vector_of_the_wrong_width():
    with pytest.raises(BankError, match=r"shape \(3,\), expected \(8,\)"):
        make_bank().add(["d"], torch.zeros(3))


@pytest.mark.parametrize("decoupled", [False, True])
def test_remove_drops_exactly_that_row(decoupled):
    bank = make_bank(decoupled=decoupled)
    bank.freeze()
    bank.trainable[2] = True
    names, descriptions, index, steer, trainable = snapshot(bank)
    bank.remove("b")
    keep = [0, 2]
    assert bank.names == ["a", "c"]
    assert bank.descriptions == [descriptions[i] for i in keep]
    assert torch.equal(bank.index, index[keep])
    assert bank.trainable.tolist() == [False, True]
    if decoupled:
        assert torch.equal(bank.steer, steer[keep])
    with pytest.raises(BankError, match="no procedure 'b'"):
        bank.remove("b")


def test_rename_keeps_the_row_and_refuses_clashes_and_unknown_names():
    bank = make_bank()
    index = bank.index.clone()
    bank.rename("b", "z")
    assert bank.names == ["a", "z", "c"]
    assert torch.equal(bank.index, index)
    with pytest.raises(BankError, match="'c' is already in the bank"):
        bank.rename("a", "c")
    with pytest.raises(BankError, match="no procedure 'b'"):
        bank.rename("b", "y")
    with pytest.raises(BankError, match="invalid procedure name"):
        bank.rename("a", " ")
    assert bank.names == ["a", "z", "c"]


@pytest.mark.parametrize("decoupled", [False, True])
def test_merge_appends_the_other_banks_rows(decoupled):
    bank, other = make_bank(decoupled=decoupled), make_bank(["x", "y"], decoupled=decoupled, seed=1)
    other.freeze()
    bank.merge(other)
    assert bank.names == ["a", "b", "c", "x", "y"]
    assert bank.descriptions[3:] == other.descriptions
    assert torch.equal(bank.index[3:], other.index)
    assert bank.trainable.tolist() == [True, True, True, False, False]
    if decoupled:
        assert torch.equal(bank.steer[3:], other.steer)


@pytest.mark.parametrize(
    "other, message",
    [
        (make_bank(["x"], fingerprint="f1"), "different backbones"),
        (make_bank(["x"], decoupled=True), "coupled bank with a decoupled one"),
        (make_bank(["x", "c", "a"]), "both banks have a, c"),
    ],
    ids=["other-backbone", "decoupled", "name-clash"],
)
def test_merge_refuses_incompatible_banks_and_changes_nothing(other, message):
    bank = make_bank()
    before = snapshot(bank)
    with pytest.raises(BankError, match=message):
        bank.merge(other)
    assert_same(snapshot(bank), before)


# ---- renormalisation ----------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [1e-8, 0.5])
def test_renormalize_follows_the_paper_formula(eps):
    bank = make_bank(["a", "b", "c", "d"])
    old = bank.index.clone()
    target = (old[0].norm() + old[2].norm()) / 2  # n̄_I over the existing rows a and c
    returned = bank.renormalize([1, 3], eps=eps)
    assert returned == pytest.approx(float(target))
    for row in (1, 3):
        expected = old[row] * target / (old[row].norm() + eps)
        torch.testing.assert_close(bank.index[row], expected)
    assert torch.equal(bank.index[[0, 2]], old[[0, 2]])


def test_renormalize_without_existing_rows_returns_none_and_changes_nothing():
    bank = make_bank()
    index = bank.index.clone()
    assert bank.renormalize([0, 1, 2]) is None
    assert torch.equal(bank.index, index)


def test_decoupled_renormalize_rescales_the_index_matrix_only():
    bank = make_bank(decoupled=True)
    steer = bank.steer.clone()
    target = bank.renormalize([2])
    assert bank.index[2].norm() == pytest.approx(target, rel=1e-5)
    assert torch.equal(bank.steer, steer)


# ---- the bank file ------------------------------------------------------------------------------
@pytest.mark.parametrize("decoupled", [False, True])
def test_save_load_round_trip_is_exact_and_loads_rows_frozen(tmp_path, decoupled):
    bank = make_bank(decoupled=decoupled)
    path = bank.save(tmp_path / "nested" / "bank.safetensors")
    loaded = MemoryBank.load(path)
    assert loaded.names == bank.names
    assert loaded.descriptions == bank.descriptions
    assert loaded.backbone == bank.backbone
    assert loaded.decoupled == decoupled
    assert torch.equal(loaded.index, bank.index)
    if decoupled:
        assert torch.equal(loaded.steer, bank.steer)
    assert bank.trainable.all() and not loaded.trainable.any()
    assert json.loads(metadata_path(path).read_text(encoding="utf-8"))["num_rows"] == 3


@pytest.fixture
def saved(tmp_path):
    """A valid bank file (rows a, b, c) to corrupt."""
    bank = make_bank()
    return bank, bank.save(tmp_path / "bank.safetensors")


def edit_metadata(**fields):
    def edit(bank, path):
        meta_file = metadata_path(path)
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        meta.update(fields)
        meta_file.write_text(json.dumps(meta), encoding="utf-8")

    return edit


def truncate(bank, path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def half_precision(bank, path):
    save_file({"index": bank.index.half()}, path)


def non_finite_rows(bank, path):
    index = bank.index.clone()
    index[1, 0] = float("nan")
    index[2, 5] = float("inf")
    save_file({"index": index}, path)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda bank, path: path.unlink(), "bank file not found"),
        (lambda bank, path: metadata_path(path).unlink(), r"bank\.safetensors\.json: bank metadata not found"),
        (lambda bank, path: metadata_path(path).write_text('{"format": "tokmem-'), "corrupted metadata"),
        (edit_metadata(format="something-else"), "not a tokmem bank"),
        (edit_metadata(format_version=99), "format version 99 is not supported"),
        (edit_metadata(names="abc"), "field 'names' is missing or not a list"),
        (truncate, "corrupted or truncated bank file"),
        (
            edit_metadata(names=["a", "b"], kinds=["text", "text"], descriptions=["", ""], schemas=[None, None]),
            r"tensor 'index' has shape \(3, 8\), the metadata says \(2, 8\)",
        ),
        (edit_metadata(kinds=["text", "tool"]), "field 'kinds' must list one of text, tool for each of the 3 names"),
        (edit_metadata(kinds=["text", "tool", "call"]), "field 'kinds' must list one of text, tool"),
        (edit_metadata(schemas=[None]), r"field 'schemas' must be a list of 3 entries"),
        (edit_metadata(schemas=[None, "x", None]), r"field 'schemas'\[1\] must be a JSON schema object or null"),
        (edit_metadata(schemas=[None, None, {"required": "city"}]), r"field 'schemas'\[2\]\.required must be a list"),
        (edit_metadata(decoupled=True), "tensor 'steer' is missing"),
        (half_precision, "dtype torch.float16, expected float32"),
        (non_finite_rows, r"NaN/Inf values in rows \[1, 2\] \(b, c\)"),
    ],
    ids=[
        "missing-file",
        "missing-json",
        "corrupted-json",
        "not-a-bank",
        "format-version",
        "bad-field",
        "truncated",
        "shape-mismatch",
        "kinds-length",
        "kinds-value",
        "schemas-length",
        "schema-type",
        "schema-required",
        "missing-steer",
        "wrong-dtype",
        "non-finite",
    ],
)
def test_load_rejects_a_broken_bank_with_a_message_naming_the_file(saved, corrupt, message):
    bank, path = saved
    corrupt(bank, path)
    with pytest.raises(BankError, match=message) as err:
        MemoryBank.load(path)
    assert path.name in str(err.value)


@pytest.mark.parametrize(
    "trained_for, message",
    [
        (
            lambda other: tokmem.create(other).bank,
            r"trained for backbone 'tiny-random-x20' \(width 64, fingerprint \w+\)",
        ),
        (lambda other: MemoryBank(32, backbone={"name": "wide"}), r"trained for backbone 'wide' \(width 32"),
    ],
    ids=["fingerprint", "hidden-size"],
)
def test_load_refuses_a_bank_trained_for_another_backbone(tmp_path, backbone, lively_backbone, trained_for, message):
    bank = trained_for(lively_backbone)
    bank.add(["a"], torch.ones(bank.hidden_size))
    path = bank.save(tmp_path / "bank.safetensors")
    with pytest.raises(BankError, match=message) as err:
        MemoryBank.load(path, backbone=backbone)
    assert f"not for 'tiny-random' (width 64, fingerprint {backbone.fingerprint()})" in str(err.value)


def test_load_accepts_the_backbone_the_bank_was_trained_for(tmp_path, lively_backbone):
    bank = tokmem.create(lively_backbone).bank
    bank.add(["a"], lively_backbone.mean_embedding())
    loaded = MemoryBank.load(bank.save(tmp_path / "bank.safetensors"), backbone=lively_backbone)
    assert torch.equal(loaded.index, bank.index)


@pytest.mark.parametrize("matrix", ["index", "steer"])
def test_save_refuses_nan_rows_and_writes_no_file(tmp_path, matrix):
    bank = make_bank(decoupled=True)
    getattr(bank, matrix)[1, 2] = float("nan")
    with pytest.raises(BankError, match="NaN/Inf rows"):
        bank.save(tmp_path / "bank.safetensors")
    assert list(tmp_path.iterdir()) == []


def poison_with_nan(bank, monkeypatch):
    bank.index[0, 0] = float("nan")


def crash_halfway(bank, monkeypatch):
    """The tensor write dies after half the bytes, e.g. a full disk."""

    def save_half(tensors, filename, metadata=None):
        data = safetensors.torch.save(tensors, metadata=metadata)
        with open(filename, "wb") as f:
            f.write(data[: len(data) // 2])
        raise OSError("No space left on device")

    monkeypatch.setattr("tokmem.bank.file_format.save_file", save_half)


@pytest.mark.parametrize("fail", [poison_with_nan, crash_halfway])
def test_failed_save_leaves_the_existing_bank_intact_and_no_temp_files(tmp_path, monkeypatch, fail):
    bank = make_bank()
    path = bank.save(tmp_path / "bank.safetensors")
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    bank.add(["d"], torch.ones(WIDTH))
    fail(bank, monkeypatch)
    with pytest.raises((BankError, OSError)):
        bank.save(path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
    assert MemoryBank.load(path).names == ["a", "b", "c"]


def test_row_kinds_survive_save_load_remove_and_merge(tmp_path):
    bank = MemoryBank(8)
    bank.add(["search", "summary"], torch.zeros(8), kinds=["tool", "text"])
    bank.save(tmp_path / "a.safetensors")
    loaded = MemoryBank.load(tmp_path / "a.safetensors")
    assert loaded.kinds == ["tool", "text"] and loaded.tool_names() == {"search"}
    other = MemoryBank(8)
    other.add(["weather"], torch.zeros(8), kinds=["tool"])
    loaded.merge(other)
    loaded.remove("summary")
    assert loaded.names == ["search", "weather"] and loaded.kinds == ["tool", "tool"]


def test_a_version_1_bank_loads_with_every_row_text(saved):
    bank, path = saved
    edit_metadata(format_version=1)(bank, path)
    meta = json.loads(metadata_path(path).read_text())
    del meta["kinds"]
    metadata_path(path).write_text(json.dumps(meta))
    assert MemoryBank.load(path).kinds == ["text"] * len(bank)


def test_adding_a_row_of_unknown_kind_is_refused():
    with pytest.raises(BankError, match="invalid row kind 'call'"):
        MemoryBank(8).add(["a"], torch.zeros(8), kinds=["call"])


def test_row_lookup_follows_every_edit():
    bank = make_bank()
    bank.rename("b", "bee")
    bank.remove("a")
    other = make_bank(names=("z",))
    bank.merge(other)
    assert [bank.row(n) for n in ("bee", "c", "z")] == [0, 1, 2] and "b" not in bank and "bee" in bank
    with pytest.raises(BankError, match="no procedure 'a'"):
        bank.row("a")


def deep(levels: int) -> str:
    return '{"format": "tokmem-bank", "format_version": 2, "x": ' + "[" * levels + "]" * levels + "}"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"backbone": "x"}, "field 'backbone' must be an object"),
        ({"backbone": {"name": "test", "fingerprint": 5}}, "field 'backbone.fingerprint' must be a non-empty text"),
        ({"hidden_size": -1}, "field 'hidden_size' must be a whole number from 1"),
        ({"hidden_size": True}, "field 'hidden_size' must be a whole number"),
        ({"hidden_size": 8.0}, "field 'hidden_size' must be a whole number"),
        ({"decoupled": "no"}, "field 'decoupled' is missing or not true/false"),
        ({"names": [[1], [2], [3]]}, "field 'names', row 0: invalid procedure name"),
        ({"names": [1, 2, 3]}, "field 'names', row 0: invalid procedure name"),
        ({"names": ["a", "", " x "]}, "field 'names', row 1: invalid procedure name"),
        ({"names": ["a", "b", "x" * 129]}, "row 2: invalid procedure name"),
        ({"names": ["a", "b", "a"]}, "field 'names' has duplicates"),
        ({"descriptions": 5}, "field 'descriptions' must list one text for each of the 3 names"),
        ({"descriptions": ["x"]}, "field 'descriptions' must list one text for each of the 3 names"),
        ({"descriptions": ["x", "y", None]}, "field 'descriptions' must list one text"),
        ({"format_version": True}, "format version True is not supported"),
    ],
    ids=repr,
)
def test_metadata_of_the_wrong_type_or_shape_is_refused_naming_the_field(saved, fields, message):
    bank, path = saved
    edit_metadata(**fields)(bank, path)
    with pytest.raises(BankError, match=message) as err:
        MemoryBank.load(path)
    assert "bank.safetensors.json" in str(err.value)


@pytest.mark.parametrize(
    "text", [deep(5000), '{"hidden_size": 1' + "0" * 5000 + "}", b"\xff\xfe"], ids=["deep", "huge-number", "not-utf8"]
)
def test_metadata_that_json_cannot_take_is_a_clear_error(saved, text):
    bank, path = saved
    metadata_path(path).write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(BankError, match="corrupted metadata"):
        MemoryBank.load(path)


@pytest.mark.parametrize("backbone", [{}, None, {"name": "test"}], ids=repr)
def test_an_upload_must_name_the_backbones_fingerprint(saved, backbone):
    bank, path = saved
    edit_metadata(backbone=backbone)(bank, path)
    tensors, metadata = path.read_bytes(), metadata_path(path).read_bytes()
    assert len(MemoryBank.from_bytes(tensors, metadata)) == 3  # a file on disk may leave it out
    with pytest.raises(BankError, match="field 'backbone' must give the backbone's 'fingerprint'"):
        MemoryBank.from_bytes(tensors, metadata, require_backbone=True)


def test_rows_far_larger_than_the_backbones_embeddings_are_refused(tmp_path, lively_backbone):
    bank = tokmem.create(lively_backbone).bank
    bank.add(["ok", "huge"], lively_backbone.mean_embedding())
    bank.index[1] = 3e38 / bank.hidden_size
    path = bank.save(tmp_path / "bank.safetensors")
    with pytest.raises(BankError, match=r"tensor 'index' has rows \[1\] with norms over"):
        MemoryBank.load(path, backbone=lively_backbone)


def test_a_directory_in_the_way_changes_nothing_and_leaves_no_temporary(tmp_path):
    bank = make_bank()
    path = bank.save(tmp_path / "bank.safetensors")
    metadata_path(path).unlink()
    metadata_path(path).mkdir()
    before = sorted(p.name for p in tmp_path.iterdir()), path.read_bytes()
    with pytest.raises(BankError, match="exists and is not a file"):
        make_bank(names=("x",)).save(path)
    assert (sorted(p.name for p in tmp_path.iterdir()), path.read_bytes()) == before


def test_a_failed_second_rename_puts_the_first_file_back(tmp_path, monkeypatch):
    bank = make_bank()
    path = bank.save(tmp_path / "bank.safetensors")
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("disk gone")
        return real_replace(src, dst)

    monkeypatch.setattr("tokmem.io.os.replace", replace)
    with pytest.raises(OSError, match="disk gone"):
        make_bank(names=("x",)).save(path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_tool_schemas_survive_save_load_remove_and_merge(tmp_path):
    bank = MemoryBank(8)
    bank.add(["weather", "summary"], torch.zeros(8), kinds=["tool", "text"], schemas=[WEATHER, None])
    bank.save(tmp_path / "a.safetensors")
    loaded = MemoryBank.load(tmp_path / "a.safetensors")
    assert loaded.tool_schemas() == {"weather": WEATHER}
    other = MemoryBank(8)
    other.add(["search"], torch.zeros(8), kinds=["tool"])
    loaded.merge(other)
    loaded.remove("summary")
    assert loaded.schemas == [WEATHER, None] and loaded.tool_schemas() == {"weather": WEATHER, "search": None}


def test_a_bank_saved_before_schemas_loads_with_none_for_every_row(saved):
    bank, path = saved
    meta = json.loads(metadata_path(path).read_text())
    del meta["schemas"]
    metadata_path(path).write_text(json.dumps(meta))
    assert MemoryBank.load(path).schemas == [None] * len(bank)
