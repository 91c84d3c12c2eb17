"""The outage scenario (``--scenario outage``): a provider in partial outage."""
