"""A fake export engine for the tests: it "exports" a model as the count of heads and FFN neurons it keeps, and
"decodes" by sleeping in proportion to that count and echoing each source sentence.

It shows that ``engine.export.base.ExportEngine`` is the only place a second engine touches: registered through
``HEADPRUNE_EXPORT_ENGINES=support.sleep_engine:SLEEP`` (with the tests folder on ``PYTHONPATH`` so that the timing
workers find it too), it is exported to, timed and reported by the plugin's own code. Its pass lasts
``SECONDS_PER_SENTENCE`` per sentence for the whole model, and the kept share of that for a pruned one, so a model
keeping half its units is timed twice as fast.
"""

import json
import os
import time

from fairseq_headprune.engine.export.base import ExportEngine, StackHeads

SECONDS_PER_SENTENCE = 0.01
MODEL_FILE = "sleep-model.json"


def _kept(mask, layers: int, units: int):
    """Per layer: the units a mask keeps (all of them without a mask)."""
    return [units] * layers if mask is None else [int((row != 0).sum()) for row in mask]


class SleepEngine(ExportEngine):
    name = "sleep"
    title = "Sleep"
    system_prefix = "sleep"
    worker_environment = {"SLEEP_ENGINE_WORKER": "1"}
    tied_attention_types = ()

    def version(self):
        return "0.1"

    def compute_types(self, device):
        return ["float32"]

    def sees_cuda(self):
        return False

    def write(self, family, cfg, task, model, quantization, directory, vocabulary_map=None):
        from fairseq_headprune.modules.masked_ffn import current_ffn_mask, ffn_layout
        from fairseq_headprune.modules.masked_multihead_attention import current_head_mask, head_layout

        head_masks, ffn_masks = current_head_mask(model) or {}, current_ffn_mask(model) or {}
        heads = {"encoder": StackHeads(), "decoder": StackHeads()}
        kept_units = total_units = 0
        for layout, masks, of_heads in ((head_layout(model), head_masks, True), (ffn_layout(model), ffn_masks, False)):
            for unit_type, (layers, units) in layout.items():
                kept = _kept(masks.get(unit_type), layers, units)
                kept_units, total_units = kept_units + sum(kept), total_units + layers * units
                if of_heads:
                    stack = heads["encoder" if unit_type == "enc-enc" else "decoder"]
                    stack.kept.update({(unit_type, layer): count for layer, count in enumerate(kept)})
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, MODEL_FILE), "w", encoding="utf-8") as stream:
            json.dump({"kept_units": kept_units, "total_units": total_units, "quantization": quantization}, stream)
        return heads

    def decoder(self, system, options, threads):
        assert os.environ.get("SLEEP_ENGINE_WORKER") == "1"  # the worker runs with the engine's environment
        with open(os.path.join(system["model"], MODEL_FILE), encoding="utf-8") as stream:
            shape = json.load(stream)
        share = shape["kept_units"] / shape["total_units"]
        batches = {}

        def run(request):
            batch_size = int(request["batch_size"])
            if request.get("batches") is not None:
                batches[batch_size] = request["batches"]
            sources = [sentence for batch in batches[batch_size]["sources"] for sentence in batch]
            start = time.perf_counter()
            time.sleep(SECONDS_PER_SENTENCE * share * len(sources))
            return {"seconds": time.perf_counter() - start, "outputs": [" ".join(tokens) for tokens in sources]}

        return run

    def kernel_lines(self, log_lines):
        return ["sleeps"]


SLEEP = SleepEngine()
