"""Past one machine: the shard statistics and campaign units as Ray tasks.

Ray is an optional extra (``pip install 'specmoe[ray]'``); it is imported only inside
functions, so everything else runs without it. :mod:`specmoe.distributed.ray_runtime` starts or
joins a Ray runtime and runs per-shard functions as tasks;
:mod:`specmoe.distributed.campaign` runs units of a campaign (each a callable with declared CPU
and GPU needs) and gathers their files into one folder.
"""
