"""Progress bars of the long passes (importance, tuning, sweeps), off with ``--no-progress``."""

from tqdm import tqdm


def progress_bar(iterable, total: int, description: str, enabled: bool):
    """A transient tqdm bar over batches (gone when done), off with ``--no-progress``."""
    return tqdm(iterable, total=total, desc=description, unit="batch", disable=not enabled, leave=False)
