"""The training split's sentence pairs as tokens, and a vocabulary map built from them for an exported model.

``study.compression.vocabulary_map`` builds the map from token pairs; this reads
them from fairseq's binarized splits (the dictionaries' own tokens, as the
exported model's vocabularies hold them) and writes the map's file, which the
export engine stores beside the model (``ExportEngine.vocabulary_map_file``).
"""

import os
from typing import Dict, Iterator, Tuple

from fairseq_headprune.engine.runners.batches import dictionary_tokens, load_split
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.compression.vocabulary_map import (
    VocabularyMap,
    build_vocabulary_map,
    vocabulary_map_coverage,
)


def split_pairs(task, split: str) -> Iterator[Tuple[list, list]]:
    """Each sentence pair of ``split`` as (source tokens, target tokens), </s> and padding left out."""
    try:
        load_split(task, split)
    except (FileNotFoundError, StudyError) as error:
        raise StudyError(f"a vocabulary map is built from the {split!r} split of {task.cfg.data}: {error}") from None
    dataset = task.dataset(split)
    source, target = task.source_dictionary, task.target_dictionary
    for index in range(len(dataset)):
        item = dataset[index]
        yield dictionary_tokens(source, item["source"].tolist()), dictionary_tokens(target, item["target"].tolist())


def vocabulary_map_for(task, per_token: int, common: int, path: str) -> Dict[str, object]:
    """Build the map on the training split, write it to ``path`` and measure its coverage of the valid split."""
    vocabulary_map: VocabularyMap = build_vocabulary_map(split_pairs(task, "train"), per_token, common)
    with open(path, "w", encoding="utf-8") as stream:
        stream.write("\n".join(vocabulary_map.lines()) + "\n")
    coverage = vocabulary_map_coverage(vocabulary_map, split_pairs(task, "valid"))
    return {"file": os.path.basename(path), "per_token": per_token, "common": common,
            "source_tokens": len(vocabulary_map.candidates), "valid_coverage": coverage}
