"""The fleet scenario (``--scenario fleet``): a partial outage of several replicas."""
