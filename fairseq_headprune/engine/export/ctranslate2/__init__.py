"""CTranslate2 as an export engine (``engine``): its spec objects built from fairseq modules (``spec``), its decoding
in a timing worker (``decoding``), and the optional package itself (``library``)."""
