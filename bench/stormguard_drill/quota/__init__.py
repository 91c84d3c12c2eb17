"""The quota scenario (``--scenario quota``): a batch job on one API key against its quota."""
