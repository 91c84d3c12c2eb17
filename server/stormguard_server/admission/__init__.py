"""Token-weighted admission in front of any engine: the controller, its bounded
priority queue, the tickets it trades in, and the waits behind Retry-After.

``AdmissionController`` is re-exported here, the name docs/vllm.md gives it."""

from stormguard_server.admission.controller import AdmissionController

__all__ = ["AdmissionController"]
