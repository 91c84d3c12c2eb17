"""The wire under a call: the client's own connection pool (its shards, its life per
process and event loop), the transport and network backend that hold every socket
operation to the call's deadline, response bodies read within a size cap, server-sent
events, and responses decoded into results or errors. No policy lives here.
"""
