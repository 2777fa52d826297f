"""Floor 2 (rule data): named orders of the callify rules, for the ordered, destructive schedules (egraph/engine/runner.py's
SCHEDULE_PRESETS and the ordering study)."""

# The reference pass's order (spec §4.2): per CONTIGUOUS it tries view folding (rule 3), then the merge with an AFTER
# into storage (rule 7), then materialization (rule 9, whose zero-size case comes first); assigns into computed
# values (rule 8) and DETACH/CONTIGUOUS_BACKWARD removal (rule 10) come after. `.contiguous()` of storage is the
# identity at construction (before any pass), and CONTIGUOUS(CONTIGUOUS(x)) reaches rule 7 in the reference because
# the inner one is materialized first (post-order), which `contiguous_idempotent` before materialization models.
REFERENCE_ORDER = ("contiguous_of_storage", "storage_through_reshape", "contiguous_to_view", "contiguous_idempotent",
                   "contiguous_of_assign", "contiguous_of_assign_n", "materialize_assign", "zero_size",
                   "materialize_contiguous", "drop_detach", "drop_contiguous_backward")
# the same with materialization first: every CONTIGUOUS is stored before a view or a merge can match it
MATERIALIZE_FIRST = ("zero_size", "materialize_contiguous", "materialize_assign", "contiguous_of_storage",
                     "storage_through_reshape", "contiguous_to_view", "contiguous_idempotent", "contiguous_of_assign",
                     "contiguous_of_assign_n", "drop_detach", "drop_contiguous_backward")
