"""The fleet scenario (``stormguard-drill --scenario fleet``): a partial outage of several
replicas under several client processes, faults piling up on a timeline
(``config.py`` says which and when).

Its modules, from the top: ``drill.py`` (every pairing, the JSON document),
``plots.py``; ``runner.py`` (one pairing: replicas, client processes, the timeline),
``faults.py`` (the replicas and the faults done at their times), ``worker.py`` (one
client process, ``python -m stormguard_drill.fleet.worker``) and ``clients.py`` (each
client over every replica); ``summary.py`` (one pairing's figures) on
``client_records.py``, ``replica_series.py``, ``fault_figures.py`` and ``targets.py``;
``records.py`` (what a pairing measured) and ``config.py`` (the knobs) at the bottom.
The figures read the records, never the runner.
"""
