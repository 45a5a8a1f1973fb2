"""Datasets: the path rules (``core.datasets``), the spec's field, the worker's resolution at attempt start and the
directory it opens for the sandbox's read-only bind (``workers.datasets.open_checked``), and the recipe's
``datasets=`` keyword."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from core.datasets import DatasetPathError, check_relative, resolve
from core.spec import JobSpec, SpecError, parse_spec_data
from core.trainer_protocol import ENV_DATASETS
from harness.deps import require_module
from workers.datasets import DatasetUnavailable, Resolved, open_checked, resolve_all

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("", "1 to 1024"),
        ("x" * 1025, "1 to 1024"),
        ("/etc", "absolute"),
        ("//etc", "absolute"),
        ("../etc", "'..'"),
        ("datasets/default/../../checkpoints", "'..'"),
        ("datasets/default/a/..", "'..'"),
        ("datasets\\default\\x", "backslash"),
        ("datasets/default/x\x00", "NUL"),
        ("checkpoints/1", "not in the data area"),
        ("runs/1/1", "not in the data area"),
        ("kiln.db", "not in the data area"),
        ("datasets", "not in the data area"),
        ("datasets/other-team/x", "not in the data area"),
        ("Datasets/default/x", "not in the data area"),
    ],
)
def test_lexical_rules_refuse(path: str, says: str) -> None:
    with pytest.raises(DatasetPathError, match=None) as caught:
        check_relative(path, "default")
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("path", "normal"),
    [
        ("datasets/default/digits", "datasets/default/digits"),
        ("./datasets//default/digits/", "datasets/default/digits"),
        ("datasets/_shared/imagenet/train", "datasets/_shared/imagenet/train"),
        ("datasets/default", "datasets/default"),
    ],
)
def test_lexical_rules_accept(path: str, normal: str) -> None:
    assert str(check_relative(path, "default")) == normal


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    root = tmp_path / "storage"
    (root / "datasets" / "default" / "digits").mkdir(parents=True)
    (root / "datasets" / "default" / "digits" / "a.npz").write_bytes(b"x")
    (root / "datasets" / "other").mkdir(parents=True)
    (root / "checkpoints" / "3").mkdir(parents=True)
    return root


def test_resolve_follows_links_only_inside_the_area(storage: Path, tmp_path: Path) -> None:
    area = storage / "datasets" / "default"
    assert resolve(storage, "datasets/default/digits", "default") == area.resolve() / "digits"
    (area / "current").symlink_to(area / "digits")
    assert resolve(storage, "datasets/default/current", "default") == area.resolve() / "digits"
    for name, target in (
        ("out", tmp_path),
        ("ckpt", storage / "checkpoints" / "3"),
        ("peer", storage / "datasets" / "other"),
        ("root", Path("/")),
    ):
        (area / name).symlink_to(target)
        with pytest.raises(DatasetPathError, match="leads out of datasets/default/"):
            resolve(storage, f"datasets/default/{name}", "default")
    with pytest.raises(DatasetPathError, match="does not exist"):
        resolve(storage, "datasets/default/missing", "default")
    with pytest.raises(DatasetPathError, match="not a directory"):
        resolve(storage, "datasets/default/digits/a.npz", "default")
    with pytest.raises(DatasetPathError, match="cannot be resolved: File name too long"):
        resolve(storage, "datasets/default/" + "x" * 300, "default")
    (area / "loop").symlink_to(area / "loop")
    with pytest.raises(DatasetPathError, match="leads out of|cannot be resolved|does not exist"):
        resolve(storage, "datasets/default/loop", "default")


def test_an_area_that_is_itself_a_link_out_is_refused(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    (storage / "datasets").mkdir(parents=True)
    (tmp_path / "elsewhere" / "x").mkdir(parents=True)
    (storage / "datasets" / "default").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DatasetPathError, match="leads out of"):
        resolve(storage, "datasets/default/x", "default")


def test_resolve_all_says_what_vanished_or_escaped(storage: Path, tmp_path: Path) -> None:
    got = resolve_all(names=["d"], registered={"d": "datasets/default/digits"}, storage=storage, team="default")
    area = (storage / "datasets" / "default").resolve()
    assert got == [Resolved("d", area / "digits", area)]
    with pytest.raises(DatasetUnavailable, match="'gone' is no longer registered in team 'default'"):
        resolve_all(names=["gone"], registered={}, storage=storage, team="default")
    (storage / "datasets" / "default" / "digits" / "a.npz").unlink()
    (storage / "datasets" / "default" / "digits").rmdir()
    with pytest.raises(DatasetUnavailable, match="dataset 'd': .* does not exist"):
        resolve_all(names=["d"], registered={"d": "datasets/default/digits"}, storage=storage, team="default")
    (storage / "datasets" / "default" / "digits").symlink_to(tmp_path)  # swapped for a link out after registration
    with pytest.raises(DatasetUnavailable, match="leads out of"):
        resolve_all(names=["d"], registered={"d": "datasets/default/digits"}, storage=storage, team="default")


BASE = {"name": "j", "team": "default", "recipe": {"name": "gpt", "hyperparameters": {"size": "tiny"}}}


def test_the_spec_names_datasets_by_name_only() -> None:
    assert parse_spec_data({**BASE, "datasets": ["digits-npz", "imagenet"]}).datasets == ["digits-npz", "imagenet"]
    assert parse_spec_data(BASE).datasets == []
    for bad, says in (
        (["/etc/passwd"], "not a valid name"),
        (["../escape"], "not a valid name"),
        (["a", "a"], "appears more than once"),
        ({"a": "/data"}, "list"),
        ([f"d{i}" for i in range(17)], "at most 16"),
    ):
        with pytest.raises(SpecError) as caught:
            parse_spec_data({**BASE, "datasets": bad})
        assert caught.value.errors[0]["loc"].startswith("datasets"), caught.value.errors
        assert says in caught.value.errors[0]["msg"], caught.value.errors


# What a spec field may be called where it would name a place on a host. Every one of them must be refused or
# named by the worker, never used as given: a new field with such a name fails here until it is confined.
PATH_WORDS = ("path", "dir", "directory", "file", "mount", "root", "volume", "location")
CONFINED = {"checkpointing.local_dir": "refused with the name of its replacement (local_tier: true)"}


def _fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for name, field in model.model_fields.items():
        out.append((prefix + name, field))
        for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out.extend(_fields(arg, f"{prefix}{name}."))
    return out


def test_no_spec_field_names_a_host_path() -> None:
    suspicious = [p for p, _ in _fields(JobSpec) if any(w in p.rsplit(".", 1)[-1] for w in PATH_WORDS)]
    assert sorted(suspicious) == sorted(CONFINED), (
        f"a spec field that may name a host path: {set(suspicious) - set(CONFINED)}; confine it under kiln's own "
        "directories (the worker names them) and list it in CONFINED"
    )
    with pytest.raises(SpecError, match="local_tier: true"):
        parse_spec_data({**BASE, "checkpointing": {"local_dir": "/etc"}})


def test_a_dataset_swapped_for_a_link_after_its_check_is_refused_when_opened(storage: Path, tmp_path: Path) -> None:
    """The worker opens the directory bubblewrap will bind (``O_NOFOLLOW``) and checks what it opened: a link swapped
    in between the resolve and the launch is refused, not followed."""
    source = (storage / "datasets" / "default" / "digits").resolve()
    dataset = Resolved(name="digits", source=source, area=source.parent)
    fd = open_checked(dataset)
    try:
        assert os.readlink(f"/proc/self/fd/{fd}") == str(source)
    finally:
        os.close(fd)
    moved = tmp_path / "moved"
    source.rename(moved)
    source.symlink_to(storage / "checkpoints")
    with pytest.raises(OSError):
        open_checked(dataset)
    source.unlink()
    outside = tmp_path / "outside"
    outside.mkdir()
    escaped = Resolved(name="digits", source=outside, area=source.parent)
    with pytest.raises(DatasetUnavailable, match="outside its area"):
        open_checked(escaped)


def test_the_recipe_gets_datasets_where_it_asks_for_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_module("torch")
    from trainer.user_error import UserError
    from trainer.user_recipe import job_datasets, takes_datasets

    def plain(hp: object) -> None: ...
    def asks(hp: object, *, datasets: object) -> None: ...

    assert not takes_datasets(plain) and takes_datasets(asks)
    spec = JobSpec.model_validate({**BASE, "datasets": ["digits"]})
    monkeypatch.setenv(ENV_DATASETS, json.dumps({"digits": str(tmp_path)}))
    got = job_datasets(spec)
    assert got == {"digits": tmp_path}
    with pytest.raises(TypeError):
        got["x"] = tmp_path  # type: ignore[index]
    monkeypatch.delenv(ENV_DATASETS)
    with pytest.raises(UserError, match="names datasets digits but KILN_DATASETS does not give them"):
        job_datasets(spec)


def test_a_write_into_a_dataset_is_the_users_error_a_read_only_disk_the_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the EROFS of a write into a dataset read as an I/O error of the host, and the job was restarted until
    its restarts ran out."""
    require_module("torch")
    import errno

    from trainer.user_error import UserError, is_infrastructure, user_code

    mounted = tmp_path / "run" / "datasets" / "digits"
    mounted.mkdir(parents=True)
    monkeypatch.setenv(ENV_DATASETS, json.dumps({"digits": str(mounted)}))
    into = OSError(errno.EROFS, "Read-only file system", str(mounted / "train-0.npz"))
    elsewhere = OSError(errno.EROFS, "Read-only file system", str(tmp_path / "run" / "out.bin"))
    assert not is_infrastructure(into)
    assert is_infrastructure(elsewhere)
    assert is_infrastructure(OSError(errno.EIO, "Input/output error", str(mounted / "train-0.npz")))
    erofs = r"your build_model\(\): OSError: \[Errno 30\] Read-only file system"
    with pytest.raises(UserError, match=erofs), user_code("your build_model()"):
        raise into
