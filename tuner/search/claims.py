"""Which process holds which config: the claim protocol of several processes searching one study
(`--workers N` on one host, or hosts sharing one database).

Optuna hands out the trials; a trial's config is claimed by whoever holds it RUNNING (asked) or
will pop it (WAITING, enqueued). Each trial records its owner ("host:pid") in its user attrs, set
under the same deferred Ctrl-C as the ask, so that:
  - a re-run on the same host fails, at once, the RUNNING trials of an owner whose pid is gone
    (killed mid-search), and their configs are proposed again;
  - a RUNNING trial with no owner ORPHAN_AFTER_S after its start was killed between the ask and
    naming itself, and is failed too;
  - of two trials that hold one config (two processes enqueued it a moment apart), the earlier
    keeps it and the later backs off;
  - a process that finishes while another owner still holds trials leaves it the decision,
    unless those trials are older than any candidate can take (a dead remote host).

Optuna's heartbeat (RDBStorage(heartbeat_interval=...) with fail_stale_trials) does not fit: it
beats only inside Study.optimize, while the search uses ask/tell to keep several trials in flight,
fail_stale_trials skips a trial killed before its first beat, and a beat says a trial is alive,
not whose it is (docs/design.md, "The search").
"""

from __future__ import annotations

import datetime as dt
import os
import socket

import optuna
from optuna.trial import TrialState

from tuner.store import config_hash

# A RUNNING trial that still has no owner this long after its ask was killed in between.
ORPHAN_AFTER_S = 120.0
RUNNING = (TrialState.RUNNING,)
HELD = (TrialState.RUNNING, TrialState.WAITING)


def owner() -> str:
    """This process, as its trials name it."""
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


class Claims:
    """The claims on the configs of one study, read from its trials."""

    def __init__(self, study: optuna.Study, families) -> None:
        self.study = study
        self.families = set(families)

    def trial_hash(self, trial) -> str | None:
        """Config hash of a trial's params (enqueued or suggested); None before it has any."""
        params = trial.system_attrs.get("fixed_params", trial.params)
        family = params.get("family")
        if family not in self.families:
            return None
        prefix = f"{family}."
        return config_hash(family, {k[len(prefix):]: v for k, v in params.items()
                                    if k.startswith(prefix)})

    def running(self) -> int:
        """RUNNING trials of every process: they count against the study's trial budget."""
        return len(self.study.get_trials(deepcopy=False, states=RUNNING))

    def claimed(self, states=HELD) -> set[str]:
        """Config hashes of trials that some process holds (RUNNING) or will (WAITING)."""
        found = set()
        for trial in self.study.get_trials(deepcopy=False, states=states):
            if trial.state == TrialState.RUNNING and "owner" not in trial.user_attrs:
                continue  # its asker died before naming itself (or is a split second from it)
            found.add(self.trial_hash(trial))
        return found - {None}

    def held_by_earlier(self, trial: optuna.Trial, digest: str) -> bool:
        """Two processes that enqueue (or sample) the same config a moment apart both see it
        free; each then holds a trial of it. The earlier trial number keeps it, the later backs
        off, so that the config is measured once. A COMPLETE earlier trial counts too: it was
        measured after this process last read the Store."""
        states = (*HELD, TrialState.COMPLETE)
        return any(other.number < trial.number and self.trial_hash(other) == digest
                   for other in self.study.get_trials(deepcopy=False, states=states))

    def fail_dead(self) -> None:
        """RUNNING trials of a process on this host that no longer exists will never be told:
        fail them, so that their configs can be proposed again. A trial without an owner long
        after its start was killed between ask and set_user_attr."""
        host = socket.gethostname()
        now = dt.datetime.now()
        for trial in self.study.get_trials(deepcopy=False, states=RUNNING):
            owner_host, _, pid = str(trial.user_attrs.get("owner", "")).rpartition(":")
            dead = owner_host == host and pid.isdigit() and not pid_alive(int(pid))
            orphan = not pid and trial.datetime_start is not None and \
                (now - trial.datetime_start).total_seconds() > ORPHAN_AFTER_S
            if dead or orphan:
                self.study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)

    def others_searching(self, stale_after: dt.timedelta) -> list[str]:
        """Owners of the study's RUNNING trials, other than this process, that may still finish:
        dead owners on this host are failed first; a trial older than `stale_after` (the longest
        a candidate can take) is taken for a dead remote owner's and ignored, so that a crashed
        host never blocks the decision."""
        self.fail_dead()
        now, me = dt.datetime.now(), owner()
        owners = []
        for trial in self.study.get_trials(deepcopy=False, states=RUNNING):
            name = trial.user_attrs.get("owner")
            fresh = trial.datetime_start is None or now - trial.datetime_start < stale_after
            if name and name != me and fresh and name not in owners:
                owners.append(name)
        return owners
