"""The team compile cache's store (core.compile_cache): entries checked before use, published atomically by the
first writer, collected by age and quota; and the key (trainer.cache_tiers.cache_fields): what decides the compiled
code is in it, the optimiser's settings are not. No process, no compile."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from core import compile_cache as store
from core.settings import Settings
from harness.deps import require_module
from scheduler.live.loop import collect_compile_caches

FIELDS = {"torch": "2.13.0", "triton": None, "mode": "regional", "graph": {"recipe": "gpt", "n_layer": 1}}


def entry_for(blob: bytes, fields: dict[str, object] = FIELDS, cold_s: float = 40.0) -> store.Entry:
    return store.Entry.for_blob(dict(fields), blob, job_id="7", attempt="12", cold_compile_s=cold_s)


def published(root: Path, blob: bytes = b"artifacts " * 100) -> store.Entry:
    entry = entry_for(blob)
    assert store.publish(root, entry, blob)
    return entry


def test_a_published_entry_reads_back_with_its_key_digest_and_writer(tmp_path: Path) -> None:
    entry = published(tmp_path)
    found = store.read(tmp_path, entry.key)
    assert found is not None and found[1] == b"artifacts " * 100
    written = json.loads((tmp_path / entry.key / store.ENTRY).read_text())
    assert written["sha256"] == hashlib.sha256(b"artifacts " * 100).hexdigest() and written["size_bytes"] == 1000
    assert (written["job_id"], written["attempt"], written["cold_compile_s"]) == ("7", "12", 40.0)
    assert written["fields"] == FIELDS and written["torch"] == "2.13.0"
    assert store.read(tmp_path, "0" * 32) is None  # no entry: a miss
    assert [p.name for p in tmp_path.iterdir()] == [entry.key]  # no temporary directory left


def test_changed_bytes_are_rejected_by_their_digest(tmp_path: Path) -> None:
    entry = published(tmp_path)
    blob = tmp_path / entry.key / store.BLOB
    data = bytearray(blob.read_bytes())
    data[10] ^= 0xFF  # same size, other bytes
    blob.write_bytes(bytes(data))
    with pytest.raises(store.Rejected, match="sha256") as info:
        store.read(tmp_path, entry.key)
    assert info.value.check == "digest"
    blob.write_bytes(bytes(data) + b"x")
    with pytest.raises(store.Rejected, match="1001 bytes"):
        store.read(tmp_path, entry.key)


def test_an_entry_built_for_another_key_is_rejected(tmp_path: Path) -> None:
    other = published(tmp_path)
    wanted = store.key_of({**FIELDS, "precision": "bf16"})
    os.rename(tmp_path / other.key, tmp_path / wanted)  # a cache built for another key, placed under this one
    with pytest.raises(store.Rejected, match=f"names key '{other.key}', not {wanted}") as info:
        store.read(tmp_path, wanted)
    assert info.value.check == "key"
    # entry.json rewritten to name the key it sits under: its fields still hash to the other key.
    path = tmp_path / wanted / store.ENTRY
    path.write_text(json.dumps({**json.loads(path.read_text()), "key": wanted}))
    with pytest.raises(store.Rejected, match=f"fields hash to {other.key}, not {wanted}"):
        store.read(tmp_path, wanted)
    path.write_text("{not json")
    with pytest.raises(store.Rejected, match="not a kiln cache entry"):
        store.read(tmp_path, wanted)


@pytest.mark.timeout(30)  # a FIFO opened to be read would block for ever
def test_a_link_or_a_fifo_in_an_entry_is_rejected_unread(tmp_path: Path) -> None:
    """A team's code may put anything in its cache and root reads it (``promote``): a file is read only if it is a
    regular file of the entry itself, never through a link, and a FIFO is refused before it is read (no block)."""
    team, outside = tmp_path / "team", tmp_path / "outside"
    entry = published(team)
    copy = published(outside)  # a valid entry, reachable only through a link
    for name, check in ((store.ENTRY, "entry"), (store.BLOB, "digest")):
        (team / entry.key / name).rename(tmp_path / name)
        (team / entry.key / name).symlink_to(outside / copy.key / name)
        with pytest.raises(store.Rejected, match=f"{name} is a link, not a file kiln wrote") as info:
            store.read(team, entry.key)
        assert info.value.check == check and str(outside) not in str(info.value)  # nothing said of its target
        (team / entry.key / name).unlink()
        (tmp_path / name).rename(team / entry.key / name)
    os.replace(team / entry.key / store.BLOB, tmp_path / store.BLOB)
    os.mkfifo(team / entry.key / store.BLOB)  # no writer: a blocking open would wait forever
    with pytest.raises(store.Rejected, match=f"{store.BLOB} is not a regular file") as info:
        store.read(team, entry.key)
    assert info.value.check == "digest"


def test_a_key_that_is_a_link_or_a_file_is_rejected_not_followed(tmp_path: Path) -> None:
    team, outside = tmp_path / "team", tmp_path / "outside"
    entry = published(outside)
    team.mkdir()
    (team / entry.key).symlink_to(outside / entry.key)  # a valid entry behind the link
    with pytest.raises(store.Rejected, match=f"{entry.key} is a link, not a directory kiln wrote") as info:
        store.read(team, entry.key)
    assert info.value.check == "entry" and str(outside) not in str(info.value)
    (team / entry.key).unlink()
    (team / entry.key).write_bytes(b"")
    with pytest.raises(store.Rejected, match=f"{entry.key} is not a directory"):
        store.read(team, entry.key)


def test_entry_json_and_the_blob_are_read_within_their_bounds(tmp_path: Path) -> None:
    entry = published(tmp_path)
    path = tmp_path / entry.key / store.ENTRY
    written = path.read_bytes()
    path.write_bytes(written + b" " * (2 << 20))  # still valid JSON, but no entry kiln writes is 2 MiB
    with pytest.raises(store.Rejected, match=f"{store.ENTRY} is over") as info:
        store.read(tmp_path, entry.key)
    assert info.value.check == "entry"
    path.write_text(json.dumps({**json.loads(written), "size_bytes": "1000"}))  # the blob's read is bounded by it
    with pytest.raises(store.Rejected, match="size_bytes") as info:
        store.read(tmp_path, entry.key)
    assert info.value.check == "entry"


def test_concurrent_publishers_of_one_key_leave_one_valid_entry(tmp_path: Path) -> None:
    blobs = [f"writer {i} ".encode() * 50_000 for i in range(8)]  # 400-450 kB each: the writes overlap
    start = threading.Barrier(len(blobs))
    won: list[bool] = [False] * len(blobs)

    def write(i: int) -> None:
        start.wait()
        won[i] = store.publish(tmp_path, entry_for(blobs[i]), blobs[i])

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(blobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(won) == 1
    key = store.key_of(FIELDS)
    found = store.read(tmp_path, key)
    assert found is not None and found[1] == blobs[won.index(True)]  # the winner's blob, whole
    assert [p.name for p in tmp_path.iterdir()] == [key]  # the others dropped theirs


def test_collection_goes_by_last_use_then_by_the_team_quota(tmp_path: Path) -> None:
    now = time.time()
    team = store.team_dir(tmp_path, 3)
    keys = []
    for i, age_days in enumerate((40, 20, 10, 1)):
        entry = entry_for(b"x" * 1000, {**FIELDS, "i": i})
        assert store.publish(team, entry, b"x" * 1000)
        os.utime(team / entry.key, (now - age_days * 86400, now - age_days * 86400))
        keys.append(entry.key)
    store.touch(team, keys[1])  # used just now: the youngest
    stale = team / f"{store.TMP_PREFIX}abandoned"
    stale.mkdir()
    os.utime(stale, (now - 2 * store.STALE_TMP_S, now - 2 * store.STALE_TMP_S))
    size = sum(f.stat().st_size for f in (team / keys[0]).iterdir())  # the blob and entry.json
    quota = 2 * size + 100  # two entries fit
    settings = Settings(storage_dir=tmp_path, compile_cache_retention_days=30, compile_cache_team_quota_bytes=quota)
    assert collect_compile_caches(settings) == 2  # the 40-day-old one, then the least recently used over quota
    assert sorted(p.name for p in team.iterdir()) == sorted([keys[1], keys[3]])
    assert store.collect(tmp_path, max_age_s=0, quota_bytes=10**9).entries == 0  # 0: no age limit


@pytest.mark.timeout(30)  # rmtree opens what it is given: a FIFO would block it for ever
def test_collection_counts_and_removes_links_without_following_them(tmp_path: Path) -> None:
    now = time.time()
    team, outside = store.team_dir(tmp_path, 3), tmp_path / "outside"
    entry = published(team)
    outside.mkdir()
    (outside / "big").write_bytes(b"h" * 100_000)
    (team / entry.key / store.BLOB).unlink()
    (team / entry.key / store.BLOB).symlink_to(outside / "big")  # not an entry kiln wrote: removed, unfollowed
    stale_file, stale_fifo = team / f"{store.TMP_PREFIX}file", team / f"{store.GONE_PREFIX}fifo"
    stale_file.write_bytes(b"left")
    os.mkfifo(stale_fifo)
    stale_dir = team / f"{store.GONE_PREFIX}dir"
    (stale_dir / "sub").mkdir(parents=True)
    os.mkfifo(stale_dir / "sub" / "fifo")
    (stale_dir / "sub" / "out").symlink_to(outside)  # emptied as a link: nothing in outside goes
    for stale in (stale_file, stale_fifo, stale_dir):
        os.utime(stale, (now - 2 * store.STALE_TMP_S, now - 2 * store.STALE_TMP_S))
    got = store.collect_team(team, max_age_s=0, quota_bytes=10**9, now=now)
    assert got.entries == 1 and got.bytes < 100_000  # the linked entry, whatever its link's target holds
    assert list(team.iterdir()) == []  # the stale ones swept
    (team / "linked").symlink_to(outside)
    assert store.discard(team, "linked") and list(team.iterdir()) == []  # no .gone- link left
    assert (outside / "big").read_bytes() == b"h" * 100_000


def test_space_a_teams_code_hides_in_its_cache_is_collected_under_the_quota(tmp_path: Path) -> None:
    """A directory inside an entry is not counted by the entry's size, and a half-written publish dated in the future
    is never stale: each held space the quota did not see, for as long as the team wanted. Now an entry holding more
    than kiln writes goes at once, and a ``.tmp-`` dated ahead of now is as stale as an old one."""
    now = time.time()
    team = store.team_dir(tmp_path, 3)
    kept, hoard = published(team), entry_for(b"y" * 100, {**FIELDS, "i": 1})
    assert store.publish(team, hoard, b"y" * 100)
    (team / hoard.key / "more").mkdir()
    (team / hoard.key / "more" / "data").write_bytes(b"h" * 100_000)
    future = team / f"{store.TMP_PREFIX}future"
    future.mkdir()
    (future / "data").write_bytes(b"h" * 100_000)
    os.utime(future, (now + 10 * 86400, now + 10 * 86400))
    assert store.collect_team(team, max_age_s=30 * 86400, quota_bytes=10**9, now=now).entries == 1
    assert [p.name for p in team.iterdir()] == [kept.key]


def test_a_stale_tree_too_deep_to_remove_does_not_stop_collection(tmp_path: Path) -> None:
    now = time.time()
    team = store.team_dir(tmp_path, 3)
    entry = published(team)
    os.utime(team / entry.key, (now - 40 * 86400, now - 40 * 86400))
    deep = team / f"{store.GONE_PREFIX}deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):  # deeper than Python's recursion limit (1000); built by descriptor, past PATH_MAX
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(parent)
    os.close(fd)
    os.utime(deep, (now - 2 * store.STALE_TMP_S, now - 2 * store.STALE_TMP_S))
    try:
        assert store.collect_team(team, max_age_s=30 * 86400, quota_bytes=10**9, now=now).entries == 1
        assert not (team / entry.key).exists()  # the old entry collected all the same
    finally:  # pytest's own clean-up of tmp_path recurses: unchain the tree two levels a step
        while (deep / "d" / "d").is_dir():
            os.rename(deep / "d" / "d", team / "next")
            os.rmdir(deep / "d")
            os.rmdir(deep)
            os.rename(team / "next", deep)
        shutil.rmtree(deep, ignore_errors=True)


def test_an_admin_promotes_a_team_entry_to_the_shared_tier(tmp_path: Path) -> None:
    entry = published(store.team_dir(tmp_path, 5))
    assert store.main(["promote", "--storage", str(tmp_path), "--team", "5", "--key", entry.key]) == 0
    found = store.read(store.shared_dir(tmp_path), entry.key)
    assert found is not None and found[0] == entry
    assert (store.shared_dir(tmp_path) / entry.key / store.BLOB).stat().st_mode & 0o777 == 0o644  # every team reads
    assert store.promote(tmp_path, 5, entry.key) is False  # already there
    assert store.main(["promote", "--storage", str(tmp_path), "--team", "6", "--key", entry.key]) == 1


def test_the_key_holds_what_decides_the_code_and_not_the_optimiser() -> None:
    torch = require_module("torch")
    from trainer.cache_tiers import cache_fields
    from trainer.recipes import load_recipe

    def key(lr: float = 3e-3, n_layer: int = 1, **over: object) -> str:
        recipe = load_recipe("gpt", {"size": "tiny", "n_layer": n_layer, "lr": lr, "warmup_steps": 3})
        args: dict[str, object] = {
            "mode": "regional",
            "model_config": recipe.graph_config(),
            "precision": "fp32",
            "device": torch.device("cpu"),
            "world_size": 1,
            "strategy": "single",
            **over,
        }
        return store.key_of(cache_fields(**args))  # type: ignore[arg-type]

    base = key()
    assert key(lr=1e-4) == base  # a sweep over the optimiser shares one entry
    others = [key(n_layer=2), key(precision="bf16"), key(world_size=2), key(strategy="ddp"), key(mode="whole")]
    others.append(key(extra={"cuda_graphs": True}))
    assert len({base, *others}) == len(others) + 1
    fields = cache_fields(
        mode="regional", model_config={}, precision="fp32", device=torch.device("cpu"), world_size=1, strategy="single"
    )
    assert {"torch", "triton", "python", "gpu", "options", "world_size", "parallelism"} <= set(fields)
    assert dataclasses.asdict(entry_for(b"")).keys() >= {"key", "sha256", "size_bytes", "written_at"}


def test_cached_kernels_keep_their_gpu_binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor drops a Triton kernel's cubin from the graph it caches unless told to keep it; a hit in another job
    or on another host then finds no kernel file (issue 40). The trainer tells it through the environment, read as
    Inductor's config loads, and the config itself where it has loaded already; only keys carrying the binaries
    match."""
    require_module("torch")
    import torch._inductor.config as inductor_config

    from trainer.builders import persist_compiler_caches
    from trainer.compile import portable_kernels

    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_KEEP_STATIC_CUBIN_RAW"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(inductor_config, "keep_static_cubin_raw", False)
    persist_compiler_caches(tmp_path)
    assert os.environ["TORCHINDUCTOR_KEEP_STATIC_CUBIN_RAW"] == "1"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert portable_kernels() is True
    assert inductor_config.keep_static_cubin_raw is True
