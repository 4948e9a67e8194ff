"""Every on-disk schema of specmoe with its reader, writer and validation (numpy; pyarrow
inside functions): no torch, transformers or matplotlib at any depth.

``trace``          routing traces (``.npz``, shard directories and their writer)
``parquet``        routing traces as Parquet, one row per token
``engine_import``  routing recorded by vLLM and SGLang (``--enable-return-routed-experts``)
``engine_layouts`` where those engines put it: responses, streams, folders
``roundlog``       round logs of speculative runs (Parquet parts)
``profile``        bandwidth profiles written by ``specmoe bench``
``runs``           runs folders that ``specmoe validate`` scores
"""
