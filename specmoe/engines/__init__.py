"""Adapters to real engines, one module each, answering the same few questions: export a
model, time a verification pass of n tokens on a KV cache of depth d, run speculative decoding
with the engine's drafters writing specmoe round logs.

``llamacpp``       llama.cpp built by ``make llama-cpp`` (GGUF export, llama-bench,
                   llama-speculative-simple); ``llamacpp_logs`` parses its output;
                   ``llamacpp_server`` runs llama-server (synthetic acceptance);
                   ``llamacpp_routing`` records routing inside llama.cpp (its eval callback).
``routing_check``  the cross-engine routing check: transformers against llama.cpp.

Submodules are imported on use; importing this package loads neither torch nor transformers.
"""
