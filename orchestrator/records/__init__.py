"""Controller-side run records: one folder per run with ``events.jsonl`` and per-host files."""

from .controller import RunRecord, default_state_dir, new_run_id

__all__ = ["RunRecord", "default_state_dir", "new_run_id"]
