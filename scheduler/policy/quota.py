"""Kueue-style quotas: nominal per team and quota key, borrowing within a cohort, lending limits.

For a team ``t`` and key ``k`` with nominal ``N``, lending limit ``L`` and borrowing limit ``B``:

* ``guaranteed = N - L`` (0 when ``L`` is None) is kept for the team alone;
* the rest, ``N - guaranteed``, goes into the cohort's pool; the pool's capacity is the sum over members;
* a team's draw on the pool is ``max(0, usage - guaranteed)``; the sum of draws never exceeds the pool;
* ``usage <= N + B`` when ``B`` is set; a team without a cohort is a cohort of one (so ``usage <= N``).

A team is *borrowing* while its usage exceeds its nominal; borrowed capacity is reclaimed by preempting the
borrower's jobs when a team within its nominal needs it. Teams with no quota rows at all are not limited.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scheduler.policy.snapshot import ANY, CPU, QuotaInfo, RunningJob, TeamInfo

Key = tuple[int, str]  # (team id, quota key)


class QuotaLedger:
    def __init__(self, teams: Iterable[TeamInfo], running: Iterable[RunningJob], *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.teams = {t.id: t for t in teams}
        self.usage: dict[Key, int] = {}
        shared: set[str] = set()  # a shared GPU is one GPU of its team's, however many fractional jobs it holds
        for job in running:
            k = (job.team_id, job.quota_key)
            units = job.gpus
            if job.share is not None:
                gpus = {g for p in job.placement for g in p.gpus}
                units = len(gpus - shared)
                shared |= gpus
            self.usage[k] = self.usage.get(k, 0) + units
        self.members: dict[str, list[int]] = {}
        for t in self.teams.values():
            self.members.setdefault(self.cohort(t.id), []).append(t.id)
        self._pool_used: dict[tuple[str, str], int] = {}
        self._pool_cap: dict[tuple[str, str], int] = {}
        self._quota: dict[Key, tuple[QuotaInfo, int]] = {}  # (quota, guaranteed)
        self._refused: dict[Key, tuple[int, int, str]] = {}  # (version, fewest units refused, why)
        self.version = 0

    def cohort(self, team_id: int) -> str:
        team = self.teams.get(team_id)
        if team is not None and team.cohort:
            return team.cohort
        return f"team:{team_id}"

    def limited(self, team_id: int) -> bool:
        team = self.teams.get(team_id)
        return self.enabled and team is not None and bool(team.quotas)

    def quota(self, team_id: int, key: str) -> QuotaInfo:
        return self._lookup(team_id, key)[0]

    def _lookup(self, team_id: int, key: str) -> tuple[QuotaInfo, int]:
        found = self._quota.get((team_id, key))
        if found is None:
            q = self.teams[team_id].quota(key)
            # A limited team without a row for this key has no nominal of its own but may borrow in its cohort.
            if q is None:
                q = QuotaInfo(key=key, nominal=0, borrowing_limit=None, lending_limit=0)
            found = self._quota[(team_id, key)] = (q, self.guaranteed(q))
        return found

    @staticmethod
    def guaranteed(q: QuotaInfo) -> int:
        return 0 if q.lending_limit is None else max(0, q.nominal - q.lending_limit)

    def _draw(self, team_id: int, key: str, usage: int) -> int:
        return max(0, usage - self._lookup(team_id, key)[1])

    def _pool(self, cohort: str, key: str) -> tuple[int, int]:
        ck = (cohort, key)
        if ck not in self._pool_cap:
            cap = used = 0
            for tid in self.members.get(cohort, []):
                if not self.limited(tid):
                    continue
                q = self.quota(tid, key)
                cap += q.nominal - self.guaranteed(q)
                used += self._draw(tid, key, self.usage.get((tid, key), 0))
            self._pool_cap[ck] = cap
            self._pool_used[ck] = used
        return self._pool_cap[ck], self._pool_used[ck]

    def borrowed(self, team_id: int, key: str) -> int:
        if not self.limited(team_id):
            return 0
        return max(0, self.usage.get((team_id, key), 0) - self.quota(team_id, key).nominal)

    def within_nominal(self, team_id: int, key: str, extra: int) -> bool:
        if not self.limited(team_id):
            return True
        return self.usage.get((team_id, key), 0) + extra <= self.quota(team_id, key).nominal

    def check(self, team_id: int, key: str, amount: int, released: Mapping[Key, int] | None = None) -> str | None:
        """None if ``amount`` more units fit; otherwise why not. ``released``: usage about to go (victims)."""
        if not self.limited(team_id):
            return None
        if not released:  # a refusal stands, for as much or more, until some usage changes
            refused = self._refused.get((team_id, key))
            if refused is not None and refused[0] == self.version and amount >= refused[1]:
                return refused[2]
            why = self._check(team_id, key, amount, {})
            if why is not None:
                self._refused[(team_id, key)] = (self.version, amount, why)
            return why
        return self._check(team_id, key, amount, released)

    def _check(self, team_id: int, key: str, amount: int, released: Mapping[Key, int]) -> str | None:
        q = self.quota(team_id, key)
        own = self.usage.get((team_id, key), 0) - released.get((team_id, key), 0)
        after = own + amount
        if q.borrowing_limit is not None and after > q.nominal + q.borrowing_limit:
            return f"team quota {key}: {own} in use; nominal {q.nominal} + borrowing limit {q.borrowing_limit}"
        cohort = self.cohort(team_id)
        cap, used = self._pool(cohort, key)
        for (tid, k), units in released.items():
            if k == key and self.cohort(tid) == cohort and self.limited(tid):
                u = self.usage.get((tid, k), 0)
                used -= self._draw(tid, k, u) - self._draw(tid, k, u - units)
        used_after = used - self._draw(team_id, key, own) + self._draw(team_id, key, after)
        if used_after > cap:
            if cohort.startswith("team:"):
                return f"team quota {key}: {own} in use of nominal {q.nominal}{self._no_row_hint(team_id, key)}"
            return (
                f"cohort {cohort} quota {key}: {max(0, cap - used)} of {cap} lendable left"
                f" (team uses {own} of nominal {q.nominal}){self._no_row_hint(team_id, key)}"
            )
        return None

    def _no_row_hint(self, team_id: int, key: str) -> str:
        """What to change when the team has no quota row for the key at all (a job naming no GPU type draws on
        ``*``, which a team given only typed quotas lacks): said, or a user reads "nominal 0" and waits."""
        team = self.teams[team_id]
        if team.quota(key) is not None:
            return ""
        if key == ANY:
            gpu = ", ".join(
                f"{q.key}: {self.usage.get((team_id, q.key), 0)} in use of {q.nominal}"
                for q in team.quotas
                if q.key != CPU
            )
            return (
                f"; the team has no quota for *, and none of its GPU quotas has room for it ({gpu or 'none'}): a job"
                " that names no GPU type runs on the first that has"
            )
        own = ", ".join(f"{q.key}={q.nominal}" for q in team.quotas)
        return f"; the team has no quota for {key} (its quotas: {own})"

    def charge(self, team_id: int, key: str, amount: int) -> None:
        self.version += 1
        k = (team_id, key)
        before = self.usage.get(k, 0)
        self.usage[k] = before + amount
        if not self.limited(team_id):
            return
        ck = (self.cohort(team_id), key)
        if ck in self._pool_cap:
            self._pool_used[ck] += self._draw(team_id, key, before + amount) - self._draw(team_id, key, before)
