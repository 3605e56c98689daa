"""Test doubles: fake kernel families that satisfy variants.base.Family and run on the CPU."""

# `tuner search` options for tests of the search's machinery on these doubles: their kernels
# compute FP8's own error, ~0.5 end to end on the realistic activations the default accuracy
# budget (0.12) holds winners to, so those tests name a budget every double that passes the gate
# meets. tests/test_budget.py holds candidates to real budgets.
ANY_ACCURACY = ["--max-error", "10"]
