"""stormguard_server: the reference server (OpenAI-compatible API, simulated engine,
token-weighted admission). Start it with ``stormguard-server``; see docs/server.md."""

from stormguard_server.app import build_state, create_app
from stormguard_server.config import AdmissionConfig, FaultConfig, ServerConfig, SimEngineConfig

__all__ = [
    "AdmissionConfig",
    "FaultConfig",
    "ServerConfig",
    "SimEngineConfig",
    "build_state",
    "create_app",
]
