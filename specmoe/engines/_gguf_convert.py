"""llama.cpp's own ``convert_hf_to_gguf.py``, run with one addition: BPE tokenizers whose
pre-tokenizer hash llama.cpp does not list but whose pre-tokenizer specmoe knows.

Run as a script in a fresh interpreter (never imported by specmoe's code):
``python _gguf_convert.py SOURCE_DIR PRE_MAP_JSON -- <convert_hf_to_gguf.py arguments>``
where SOURCE_DIR holds llama.cpp's source (``convert_hf_to_gguf.py``, ``conversion/``,
``gguf-py/``) and PRE_MAP_JSON maps a hash (``chkhsh`` in ``TextModel.get_vocab_base_pre``:
the sha256 of ``str(tokenizer.encode(chktxt))``) to the name of a pre-tokenizer llama.cpp
implements (``gpt-2``). A hash llama.cpp knows keeps llama.cpp's answer; one neither knows
still fails as llama.cpp fails. And a model without ``tokenizer.model`` converts without the
sentencepiece package (the converter imports it before it looks for the file). And an OLMoE
checkpoint keeps its own RMSNorm epsilon: llama.cpp's ``OlmoeModel`` writes 1e-5 over the
value the base class took from ``config.json`` (equal for OLMoE's released checkpoints, not for
a model whose epsilon differs, such as one lifted to wider shapes by ``specmoe lift``).
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path


def _patch(pre_map: dict[str, str]) -> None:
    from conversion import base

    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            from hashlib import sha256

            chktxt = original.__code__.co_consts  # the probe text is the function's constant
            text = next(c for c in chktxt if isinstance(c, str) and c.startswith("\n \n\n"))
            chkhsh = sha256(str(tokenizer.encode(text)).encode()).hexdigest()
            if chkhsh in pre_map:
                base.logger.info(f"tokenizer.ggml.pre: {pre_map[chkhsh]!r} (chkhsh {chkhsh})")
                return pre_map[chkhsh]
            raise

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    # A model without tokenizer.model is not a SentencePiece one: say so before the import of
    # sentencepiece (which the converter makes first), so that a missing package does not stop
    # it from falling back to the Hugging Face tokenizer, as it does when the package is there.
    original_sp = base.TextModel._create_vocab_sentencepiece

    def _create_vocab_sentencepiece(self):
        if not (self.dir_model / "tokenizer.model").is_file():
            raise FileNotFoundError(f"File not found: {self.dir_model / 'tokenizer.model'}")
        return original_sp(self)

    base.TextModel._create_vocab_sentencepiece = _create_vocab_sentencepiece

    from conversion import olmo

    def set_gguf_parameters(self):
        base.TextModel.set_gguf_parameters(self)  # writes config.json's rms_norm_eps when set
        if self.find_hparam(["rms_norm_eps", "norm_eps"], optional=True) is None:
            self.gguf_writer.add_layer_norm_rms_eps(1e-5)  # llama.cpp's value, as before

    olmo.OlmoeModel.set_gguf_parameters = set_gguf_parameters


def main(argv: list[str]) -> None:
    source, pre_map_json, sep, *rest = argv
    if sep != "--":
        raise SystemExit("usage: _gguf_convert.py SOURCE_DIR PRE_MAP_JSON -- ARGS...")
    src = Path(source)
    sys.path.insert(0, str(src))
    sys.path.insert(1, str(src / "gguf-py"))
    _patch(json.loads(pre_map_json))
    script = src / "convert_hf_to_gguf.py"
    sys.argv = [str(script), *rest]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
