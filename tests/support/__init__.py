"""What the tests share beyond fixtures: the writer of checkpoints in the old formats of the released models
(``scripts/reproductions/legacy_checkpoints.py``, which the stand-in bundles use too)."""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "reproductions" / "legacy_checkpoints.py"
_SPEC = importlib.util.spec_from_file_location("legacy_checkpoints", _PATH)
legacy_checkpoints = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(legacy_checkpoints)
write_legacy_checkpoint = legacy_checkpoints.write_legacy_checkpoint
write_legacy_roberta_checkpoint = legacy_checkpoints.write_legacy_roberta_checkpoint
