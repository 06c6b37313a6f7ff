"""Settings of the ablation studies (Michel et al. section 3), validated where they are made."""

from dataclasses import dataclass, field
from typing import List, Optional

from fairseq_headprune.constants import ABLATION_MODES, ATTENTION_TYPES
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.settings import SweepSettings, check_one_of, refuse


@dataclass
class AblationSettings:
    """``ablate``: which study, on which heads (Michel et al. section 3)."""

    sweep: SweepSettings
    mode: str = "single"
    types: List[str] = field(default_factory=lambda: list(ATTENTION_TYPES))
    heads: Optional[str] = None  # spec of the heads to ablate (single, cross-domain)
    select_subset: Optional[str] = None  # all-but-one: choose each layer's head on this split
    cross_subset: Optional[str] = None  # cross-domain: the out-of-domain split
    cross_data: Optional[str] = None  # its data directory (default: the sweep's)

    def __post_init__(self):
        check_one_of(self.mode, ABLATION_MODES, "mode")
        if self.mode == "cross-domain" and not self.cross_subset:
            raise SettingsError("the mode cross-domain needs the cross subset SPLIT (the out-of-domain test set)",
                                setting=("mode", "cross_subset"))
        refuse(self.select_subset and self.mode != "all-but-one", "the select subset is for the mode all-but-one",
               ("select_subset", "mode"))
