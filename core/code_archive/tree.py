"""What an archive unpacks to, as a tree of names: duplicates, paths through links and escaping links refused."""

from __future__ import annotations

from .base import (
    DIRECTORY,
    DRIVE,
    FILE,
    LINK,
    MAX_LINK_BYTES_TOTAL,
    MAX_LINK_COMPONENTS,
    MAX_LINK_LEVELS,
    MAX_NAME_BYTES,
    ArchiveError,
    ArchiveLimits,
    ArchiveSummary,
    Member,
    show,
)


class Tree:
    """What the archive unpacks to, as a tree of names (no file system involved): entries are added in the
    archive's order, with the directories their paths imply; ``finish`` resolves every link's target through the
    links of the archive, as the kernel would once everything is unpacked.

    Rules: no entry's path goes through a link or a file (an entry written through a link), no name twice (a
    directory may be repeated), every link's target stays inside however the links it meets resolve. Memory:
    under a kilobyte a node (a directory's path is kept as a tuple of shared names; entries count the directories
    their paths imply, so nodes <= max_entries: 16 MB for 20,000 directories 64 deep) plus the link targets
    (MAX_LINK_BYTES_TOTAL)."""

    def __init__(self, limits: ArchiveLimits) -> None:
        self.limits = limits
        self.kind: list[str] = [DIRECTORY]  # node 0: the archive's root
        self.parent: list[int] = [0]
        self.name: list[str] = [""]
        self.children: dict[tuple[int, str], int] = {}
        self.targets: dict[int, str] = {}
        self.unpacked = 0
        self.link_bytes = 0
        self._dirs: dict[tuple[str, ...], int] = {(): 0}  # every directory's path, to its node
        self._names: dict[str, str] = {}  # one string per name, shared by the paths above

    def path(self, node: int) -> str:
        names = []
        while node:
            names.append(self.name[node])
            node = self.parent[node]
        return "/".join(reversed(names))

    def _new(self, parent: int, name: str, kind: str) -> int:
        node = len(self.kind)
        if node > self.limits.max_entries:
            raise ArchiveError(f"more than {self.limits.max_entries} entries (with the directories their paths imply)")
        self.kind.append(kind)
        self.parent.append(parent)
        self.name.append(name)
        self.children[(parent, name)] = node
        return node

    def directory(self, parts: tuple[str, ...], entry: str) -> int:
        """The node of the directory ``parts``, made (implied) where missing; refuses a path through a link or
        a file. One lookup for a directory already held, whatever its depth; else from the deepest one held."""
        node = self._dirs.get(parts)
        if node is not None:
            return node
        held = len(parts) - 1
        while held and parts[:held] not in self._dirs:
            held -= 1
        node = self._dirs[parts[:held]]
        for i in range(held, len(parts)):
            child = self.children.get((node, parts[i]))
            if child is None:
                child = self._new(node, parts[i], DIRECTORY)
            elif self.kind[child] != DIRECTORY:
                through = "/".join(parts[: i + 1])
                raise ArchiveError(f"{show(entry)}: written through the {self.kind[child]} {show(through)}")
            node = child
            self._dirs[parts[: i + 1]] = node
        return node

    def add(self, m: Member) -> None:
        """``m`` in the tree, or ArchiveError (the root directory, or a directory again: nothing to add)."""
        if not m.parts:
            if m.kind == DIRECTORY:
                return
            raise ArchiveError(f"{show(m.name)}: a {m.kind} in the place of the archive's own directory")
        parts = tuple(map(self._names.setdefault, m.parts, m.parts))
        parent = self.directory(parts[:-1], m.name)
        existing = self.children.get((parent, parts[-1]))
        if existing is not None:
            if m.kind == DIRECTORY == self.kind[existing]:
                return
            raise ArchiveError(f"{show(m.name)}: a {m.kind} where the archive already has a {self.kind[existing]}")
        if m.kind == FILE:
            self.unpacked += m.size
            if self.unpacked > self.limits.max_unpacked_bytes:
                raise ArchiveError(
                    f"{show(m.name)}: more than {self.limits.max_unpacked_bytes} bytes unpacked "
                    f"({self.unpacked} with this file of {m.size})"
                )
        node = self._new(parent, parts[-1], m.kind)
        if m.kind == DIRECTORY:
            self._dirs[parts] = node
        elif m.kind == LINK:
            self._link(node, m)

    def _link(self, node: int, m: Member) -> None:
        target = m.target
        if not target:
            raise ArchiveError(f"{show(m.name)}: link to nothing (an empty target)")
        if target.startswith("/") or DRIVE.match(target):
            raise ArchiveError(f"{show(m.name)}: link to an absolute path ({show(target)})")
        if "\x00" in target:
            raise ArchiveError(f"{show(m.name)}: invalid link target (NUL)")
        size = len(target) if target.isascii() else len(target.encode())
        if size > MAX_NAME_BYTES:
            raise ArchiveError(f"{show(m.name)}: link target over {MAX_NAME_BYTES} bytes ({size})")
        if target.count("/") >= MAX_LINK_COMPONENTS:
            raise ArchiveError(f"{show(m.name)}: link target of more than {MAX_LINK_COMPONENTS} components")
        self.link_bytes += size
        if self.link_bytes > MAX_LINK_BYTES_TOTAL:
            raise ArchiveError(f"{show(m.name)}: link targets of more than {MAX_LINK_BYTES_TOTAL} bytes in all")
        self.targets[node] = target

    def resolve(self, link: int, memo: dict[int, tuple[int, int]], active: set[int]) -> tuple[int, int]:
        """Where ``link`` leads, as (node, depth below it of names the archive does not hold): each component of
        its target taken in turn from the link's directory, '..' to the parent (out of the root: refused), a link
        met on the way replaced by where it leads (memoised; at most MAX_LINK_LEVELS inside one another). Names the
        archive does not hold are followed lexically; the kernel would fail there instead, so this never keeps in
        a path that the kernel would take out."""
        if link in memo:
            return memo[link]
        if link in active:
            raise ArchiveError(f"{show(self.path(link))}: link loop ({show(self.targets[link])} leads back to it)")
        if len(active) >= MAX_LINK_LEVELS:
            raise ArchiveError(f"{show(self.path(link))}: more than {MAX_LINK_LEVELS} links inside one another")
        active.add(link)
        target = self.targets[link]
        node, below = self.parent[link], 0
        through: int | None = None
        for part in target.split("/"):
            if not part or part == ".":
                continue
            if part == "..":
                if below:
                    below -= 1
                elif node == 0:
                    via = f" through the link {show(self.path(through))}" if through is not None else ""
                    raise ArchiveError(f"{show(self.path(link))}: link leaves the archive{via} ({show(target)})")
                else:
                    node = self.parent[node]
            elif below:
                below += 1
            else:
                child = self.children.get((node, part))
                if child is None:
                    below = 1
                elif self.kind[child] == LINK:
                    node, below = self.resolve(child, memo, active)
                    through = child
                else:
                    node = child
        active.discard(link)
        memo[link] = (node, below)
        return node, below

    def finish(self) -> ArchiveSummary:
        if len(self.kind) == 1:
            raise ArchiveError("the archive is empty")
        memo: dict[int, tuple[int, int]] = {}
        for link in self.targets:
            self.resolve(link, memo, set())
        return ArchiveSummary(entries=len(self.kind) - 1, unpacked_bytes=self.unpacked)
