"""What an export engine does for the plugin: the one interface a deployment engine is reached through.

A compressed model is deployed in an engine other than fairseq (CTranslate2
is the one shipped, ``export/ctranslate2/``). Everything the plugin asks of
such an engine is a method here: which compute types it runs on a device,
writing a model from a masked, tuned or shrunk checkpoint (with a vocabulary
map where it has one), loading that model in a timing worker's process and
decoding the sentences the parent hands it (``engine.timing``; the
per-layer latency table of ``engine.search.exported_latency`` is timed
through the same two methods).
The engines are chosen by name from ``engines.export_engines()``; nothing
outside an engine's folder imports the engine's own library.
"""

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple


@dataclass
class StackHeads:
    """Heads kept in each attention layer of one stack, and the count the engine gets (the largest: an engine with
    one head count per stack pads the other layers with zero heads)."""

    kept: Dict[Tuple[str, int], int] = field(default_factory=dict)

    @property
    def num_heads(self) -> int:
        return max(max(self.kept.values(), default=0), 1)  # a stack without heads keeps one zero head

    @property
    def headless(self) -> bool:
        """No layer keeps a head: each holds one zero head, as an engine cannot hold an empty attention."""
        return max(self.kept.values(), default=0) == 0

    @property
    def padded(self) -> int:
        """Zero heads added to even uneven layers out (the cost of unevenness; 0 for a head-less stack)."""
        return 0 if self.headless else sum(self.num_heads - kept for kept in self.kept.values())


# a timing worker's pass: the request ({"batch_size": B, "batches": ...}) -> {"seconds": s, "outputs": [...]}
Decode = Callable[[Dict[str, object]], Dict[str, object]]


class ExportEngine:
    """One deployment engine (see the module). Subclasses set the names and implement every method."""

    name: str  # the value of --export and of a timed system's engine
    title: str  # how reports spell the engine
    system_prefix: str  # the first word of its timed systems' names ("ct2 compressed float32")
    vocabulary_map_file: Optional[str] = None  # the file in a model's directory restricting its output (None: none)
    worker_environment: Dict[str, str] = {}  # variables a timing worker of this engine runs with
    # attention types the engine gives one head count together (a decoder's self- and cross-attention)
    tied_attention_types: Tuple[Tuple[str, ...], ...] = ()

    def version(self) -> Optional[str]:
        """The installed engine's version (None: not installed)."""
        raise NotImplementedError

    def compute_types(self, device: str) -> List[str]:
        """The weight types the installed engine computes on ``device`` ("cpu" or "cuda")."""
        raise NotImplementedError

    def sees_cuda(self) -> bool:
        """Whether the installed engine sees a CUDA device."""
        raise NotImplementedError

    def write(self, family, cfg, task, model, quantization: str, directory: str,
              vocabulary_map: Optional[str] = None) -> Dict[str, StackHeads]:
        """Write ``model`` (its masks, tunings and removals as set) into ``directory`` at ``quantization``, with the
        vocabulary map file ``vocabulary_map`` if given; returns the heads each stack kept."""
        raise NotImplementedError

    def decoder(self, system: Dict[str, object], options, threads: int) -> Decode:
        """In a timing worker's process: load ``system`` (``SystemSpec.to_dict``) and return its pass."""
        raise NotImplementedError

    def kernel_lines(self, log_lines: Sequence[str]) -> List[str]:
        """The engine's own account of the kernels it runs, from a timing worker's log (none by default)."""
        return []
