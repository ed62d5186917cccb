"""Every setting of ``tokmem serve``, defined once: the command's flags are generated from ``ServeConfig``.

The defaults are safe on an open network: loopback only, bounded prompts, bodies, queues, connections
and read times.  With ``api_key`` set, bank management needs it (``protect="manage"``) or every ``/v1``
route does (``protect="all"``); ``exposure_warning`` says when management is open beyond this machine.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Literal


def _help(text: str, **more) -> dict:
    return field(metadata={"help": text}, **more)


@dataclass
class ServeConfig:
    banks: str = _help("folder of banks: NAME.safetensors + NAME.safetensors.json")
    backbone: str = _help("the frozen backbone the banks were trained for", default="smollm2-135m")
    host: str = _help("address to listen on (default: loopback only)", default="127.0.0.1")
    port: int = _help("port to listen on", default=8000)
    api_key: str | None = _help("bearer token that protected routes need (see --protect)", default=None)
    protect: Literal["manage", "all"] = _help(
        "with --api-key: 'manage' = PUT/DELETE /v1/banks need the key; 'all' = every /v1 route does", default="manage")
    device: str | None = _help("cpu, cuda, … (default: cuda when available)", default=None)
    seed: int = _help("seed of the sampler (requests with temperature > 0)", default=0)
    # the engine and the bank registry
    max_batch: int = _help("rows decoded together", default=32)
    max_queue: int = _help("waiting requests; more get 429", default=256)
    max_resident: int = _help("banks kept loaded (least recently used leave)", default=256)
    # per request
    max_prompt_chars: int = _help("characters of prompt text, checked before tokenising; more get 400", default=65_536)
    max_prompt_tokens: int = _help("tokens of the chat-formatted prompt; more get 400", default=2048)
    max_new_tokens: int = _help("the most tokens a request may ask for", default=1024)
    default_max_tokens: int = _help("tokens answered when a request does not say", default=128)
    timeout: float = _help("seconds per request, queueing included; then 504", default=120.0)
    # connections
    max_body_mb: float = _help("request body limit in MiB; larger bodies get 413", default=8.0)
    header_timeout: float = _help("seconds a connection may take to send a request's headers; then it is closed", default=10.0)
    body_timeout: float = _help("seconds a request may take to send its body; then 408", default=30.0)
    keep_alive: int = _help("seconds an idle keep-alive connection stays open", default=5)
    max_connections: int = _help("open connections and running requests at once; more get 503", default=512)

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 2**20)


def exposure_warning(config: ServeConfig) -> str | None:
    """A warning when anyone who can reach the server may upload or delete banks, else None."""
    if config.api_key or _loopback(config.host):
        return None
    return (f"bank management (PUT/DELETE /v1/banks) is open to anyone who can reach {config.host}:{config.port}; "
            "pass --api-key to protect it")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
