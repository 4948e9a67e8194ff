"""HF MoE models, routing capture and the speculative engine (torch and transformers live here).

``models``   load supported MoE families offline, tiny random models, router discovery.
``capture``  record the experts each token selects (teacher-forced or while generating).

Submodules are imported on use; importing this package loads neither torch nor transformers.
"""
