"""Export engines: a masked, tuned or shrunk model written for a deployment engine and timed there (``base``), the
engines by name (``engines``), one folder per engine (``ctranslate2/``), and the vocabulary map a translation model
may carry (``vocabulary_map``)."""
