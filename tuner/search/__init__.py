"""The search for one problem: an Optuna study that proposes feasible configs, compile sandboxes
that build them ahead of the GPU, one GPU sandbox that validates them, holds them to the accuracy
budget (tuner/budget.py) and times them, and a final re-time that decides the winner against the
family default.

One job per module, in the order a candidate meets them:
  settings    SearchSettings and the constants the parts share (no Optuna)
  target      where candidates run: GPU profile, device fingerprint, torch device
  storage     the Optuna storage, study names, the sampler, opening a study with its seed
  claims      which process holds which config when several search one study
  known       the configs known near the problem: the GPU's table, the database's winners
  proposal    the feasible space, the mode, the next candidate from the study
  pool        compile sandboxes ahead of the GPU sandbox
  records     a sandbox's result as one Store row; what the Store holds for the study
  decision    the side-by-side re-time and the spread rule that keeps the default
  run         ProblemSearch: the loop that ties them together
  interrupts  Ctrl-C held back while the Store and the study are written together

Several processes may search one study at once (one per GPU, DESIGN.md; `--workers N` starts
them, tuner/multi_gpu.py): Optuna hands out the trials and claims.py keeps one config with one
trial. With `--workers` the searching processes skip the decision and their parent makes it once
(ProblemSearch.decide); hosts sharing a study through one database decide in the process that
finishes last (ProblemSearch.run).
"""

from tuner.search.claims import ORPHAN_AFTER_S, Claims
from tuner.search.decision import TOP_K_RETIME, ProblemResult, pick_winner
from tuner.search.pool import Pipeline, decision_pipeline
from tuner.search.proposal import Space, feasible_configs, params_of, suggest
from tuner.search.records import Candidate, code_version
from tuner.search.run import ProblemSearch, Progress
from tuner.search.settings import FAILED_VALUE_MS, MAX_BARREN_ASKS, SearchSettings
from tuner.search.storage import family_set_name, make_sampler, open_storage, study_name
from tuner.search.target import Target, make_target, runs_on_cpu

__all__ = [
    "FAILED_VALUE_MS", "MAX_BARREN_ASKS", "ORPHAN_AFTER_S", "TOP_K_RETIME", "Candidate", "Claims",
    "Pipeline", "ProblemResult", "ProblemSearch", "Progress", "SearchSettings", "Space", "Target",
    "code_version", "decision_pipeline", "family_set_name", "feasible_configs", "make_sampler",
    "make_target", "open_storage", "params_of", "pick_winner", "runs_on_cpu", "study_name",
    "suggest",
]
