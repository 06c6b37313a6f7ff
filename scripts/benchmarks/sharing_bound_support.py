"""What configurations of a sweep could share, measured on the serial run (``benchmark_ablation.py``).

On a CPU every operation is synchronous, so forward hooks time the modules
each configuration runs; from those times, ``sharing_bound`` is the most
that exact sharing of work across configurations (the encoder, the decoder
layers below the first masked one) could skip.
"""

import time

from fairseq_headprune.constants import ATTENTION_TYPES


class ModuleTimes:
    """Seconds each configuration of the serial run spends in the encoder (its embeddings and layers), in
    each decoder layer and in each decoder layer's self-attention (forward hooks; only meaningful where
    operations are synchronous)."""

    def __init__(self, model):
        self.model, self.by_config, self._current, self._handles = model, {}, {}, []

    def _add(self, key, seconds):
        self._current[key] = self._current.get(key, 0.0) + seconds

    def _time(self, module, key):
        started = [0.0]

        def start(*_):
            started[0] = time.perf_counter()

        def stop(*_):
            self._add(key, time.perf_counter() - started[0])

        self._handles += [module.register_forward_pre_hook(start), module.register_forward_hook(stop)]

    def __enter__(self):
        # fairseq calls the encoder's forward() directly (no module hooks), and encoder reuse wraps the
        # instance's forward_torchscript: the encoder is timed through its embeddings and layers
        encoder = self.model.encoder
        for part in [encoder.embed_tokens, encoder.embed_positions, *encoder.layers, encoder.layer_norm]:
            if part is not None:
                self._time(part, "encoder")
        for index, layer in enumerate(self.model.decoder.layers):
            self._time(layer, ("decoder", index))
            self._time(layer.self_attn, ("self_attn", index))
        return self

    def __exit__(self, *_):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def finish(self, name):
        """What was timed since the last call belongs to configuration ``name`` (None: to nobody)."""
        if name is not None:
            self.by_config[name] = self._current
        self._current = {}


def sharing_bound(timer, masks, serial_total):
    """What exact sharing of work across configurations could skip, as fractions of the serial time.

    A configuration that masks no Enc-Enc head has the unmasked encoder's
    output; decoder layers below its first masked decoder layer (and that
    layer's self-attention, when only its Enc-Dec heads are masked or the
    encoder is: then the first layer's self-attention) compute
    what the unmasked model computes -- but only on rows whose beam holds the
    same prefix, so counting them in full is an upper bound. Everything else
    (the masked layers and those above them, the output layer over the
    vocabulary, log-softmax, beam search) differs per configuration.
    """
    encoder = decoder_below = 0.0
    layers = len(timer.model.decoder.layers)
    for name, head_mask in masks.items():
        if head_mask is None:
            continue
        times = timer.by_config[name]
        masked = {t: (head_mask[t] == 0).any(dim=1).tolist() for t in ATTENTION_TYPES if t in head_mask}
        if any(masked.get("enc-enc", [])):
            first = 0  # another encoder output: every Enc-Dec attention differs
        else:
            encoder += times.get("encoder", 0.0)
            first = next((layer for layer in range(layers)
                          if any(masked[t][layer] for t in ("enc-dec", "dec-dec") if t in masked)),
                         layers)
        decoder_below += sum(times.get(("decoder", layer), 0.0) for layer in range(first))
        if first < layers and not masked.get("dec-dec", [False] * layers)[first]:
            decoder_below += times.get(("self_attn", first), 0.0)
    return {"encoder": encoder / serial_total, "decoder_below": decoder_below / serial_total,
            "fraction": (encoder + decoder_below) / serial_total}
