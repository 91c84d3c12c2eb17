"""The outage scenario (``stormguard-drill --scenario outage``): a provider in partial
outage, then recovering.

The second incident: a hosted LLM service in partial outage ("service busy, switch to
another LLM API for now"): calls timed out or got 5xx, the ones that succeeded waited
ten times longer for their first token, and recovery was gradual. Each client under
test has a primary and a secondary provider, two reference servers of its own:

- **healthy** (``healthy_s``): the primary answers its first token after
  ``primary_latency_s``; the secondary, healthy throughout, after the longer
  ``secondary_latency_s``;
- **outage** (``outage_s``, 60 s in the full run): on the primary a share of requests
  fail with a 500 (``error_rate``), a share hang without an answer (``hang_rate``, the
  server's hang fault), and the rest wait ten times longer for their first token;
- **recovery** (``recovery_s``, 30 s): the three faults fall linearly to nothing, one
  step a second;
- **after** (``after_s``): the primary healthy again; how soon calls are back on it.

Open-loop Poisson arrivals at ``rate`` calls per second, the same seeded schedule for
every client; each call is streamed and has ``deadline_s``, after which the caller
gives up on it. The pairings run one at a time in the full run and all at once in the
quick one (``concurrency``), each on its own two servers. Per window: success within
the deadline, p50/p99 latency and time to first token, the share of calls served by
the secondary, and the attempts per call at each provider (the servers' own counts,
scraped twice a second); then how long after the recovery traffic is back on the
primary (``back_on_primary_s``), and the primary's attempts over the calls offered at
their peak after the outage (a burst shows above 1). The targets are checked on stormguard's row.

Its modules, from the top: ``drill.py`` (every client's pairing, the JSON document),
``runner.py`` (one pairing: the servers, the replay, the faults driven, the scrapes),
``summary.py`` (the figures and the targets), ``records.py`` (what a pairing measured),
``clients.py`` (each client with a primary and a secondary), ``config.py`` (the phases,
the faults over time, the presets and the schedule).
"""
