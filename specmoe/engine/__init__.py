"""HF MoE models, routing capture and the speculative engine (torch and transformers live here).

``families/``   one file per Hugging Face MoE family (OLMoE, Qwen2/Qwen3-MoE, Mixtral,
                DeepSeek-V2/V3, gpt-oss) behind one registry keyed by ``model_type``: where the
                router and experts are, and the routing rule applied to router logits.
``models``      load supported MoE families offline, tiny random models, router discovery.
``capture``     record the experts each token selects (teacher-forced or while generating).
``switch``      a kernel switch on every MoE layer (per-slot, dedup, auto from the crossover),
                forced routing, dummy-weight models at preset shapes.
``drafters``    who proposes the k tokens of a verification pass.
``speculative`` the speculative loop: draft, verify in one pass, crop the KV cache, log a round.
``measure``     verify-time measurements of whole-model passes (paper 002 Section 4).
``efficiency``  target efficiency against batch size with forced routing (paper 003).
``runner``      the run harness behind ``specmoe run`` and the runs campaign: load a target,
                build prompts, force routing, run a grid of generations into a round log.

Submodules are imported on use; importing this package loads neither torch nor transformers.
"""
