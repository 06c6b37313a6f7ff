"""The console of the commands and of the processes they spawn: their own output and real problems only."""

import importlib
import logging
import warnings


def quiet_libraries() -> None:
    """Keep the study commands' console to their own output and real problems."""

    # fairseq's config conversion goes through hydra, which warns about its own API
    # and may turn the root logger to DEBUG
    warnings.filterwarnings("ignore", module=r"hydra(\.|$)")
    warnings.filterwarnings("ignore", message=r"\s*'config' is validated against ConfigStore")
    warnings.filterwarnings("ignore", message=r"\s*The strict flag in the compose API")
    # fairseq's batch iterator asks for pinned memory on machines without a GPU too
    warnings.filterwarnings("ignore", message=r".*'pin_memory' argument is set as true")
    # fairseq's fused path hands torch a boolean padding mask beside a float causal mask (LMs)
    warnings.filterwarnings("ignore", message=r"Support for mismatched key_padding_mask and attn_mask")
    # fairseq's own warning about its use of torch's deprecated autocast, on every training step
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"fairseq(\.|$)")
    for name in ("fairseq", "fairseq_cli", "fairseq_headprune", "hydra", "matplotlib", "PIL"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # fairseq's --eval-bleu scores tokenized text on purpose; sacreBLEU warns that it looks tokenized
    logging.getLogger("sacrebleu").setLevel(logging.ERROR)


def run_quietly(module: str, function: str, *arguments) -> None:
    """A spawned process's target: quiet the libraries, then import ``module`` and call its ``function``.

    A spawned child imports its target's module before running any of it, and importing fairseq then logs
    notices (missing optional packages) that the parent's console never shows; this module imports no
    fairseq, so the child is quiet before fairseq is imported.
    """
    quiet_libraries()
    getattr(importlib.import_module(module), function)(*arguments)
